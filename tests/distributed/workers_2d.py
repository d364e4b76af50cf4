"""Rank code of test_2d.py: FSDP2 x tensor parallelism on a 2x2 mesh of 4 processes
against one CPU process on the global batch."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module
from workers_tp import Block, _plan

TOL = 3e-5
STEPS, BATCH, SEQ, D = 3, 4, 8, 32


def _batch(step: int):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, D, generator=g)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def _reference():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def _train():
    mesh = init_device_mesh("pjrt", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    model = _model().to("pjrt")
    for block in model:
        parallelize_module(block, mesh["tp"], _plan(False))
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    losses = []
    rows = slice(dp * BATCH // 2, (dp + 1) * BATCH // 2)
    for step in range(STEPS):
        x, y = _batch(step)
        loss = F.mse_loss(model(x[rows].to("pjrt")), y[rows].to("pjrt"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # tp ranks hold the same loss
        losses.append(total.item())
    return losses, {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}


def run_all() -> dict:
    dist.init_process_group("pjrt", timeout=timedelta(seconds=120))
    out = {}
    try:
        (losses, params), (ref_losses, ref_params) = _train(), _reference()
        out["losses"], out["ref_losses"] = losses, ref_losses
        out["param_diff"] = max((params[k] - v).abs().max().item()
                                for k, v in ref_params.items())
    except Exception:  # noqa: BLE001 - reported
        out["error"] = traceback.format_exc(limit=-10)
    dist.destroy_process_group()
    return out
