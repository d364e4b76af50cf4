"""Rank code of test_checkpoint.py: torch.distributed.checkpoint of an FSDP2 model and
its optimizer on pjrt, and a run resumed from it."""

from __future__ import annotations

import os
import shutil
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from workers_fsdp import Net, _batch

import torch_pjrt

STEPS, STOP = 4, 2


def _model(n: int):
    torch.manual_seed(0)
    model = Net().to("pjrt")
    mesh = init_device_mesh("pjrt", (n,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _steps(model, opt, first: int, last: int, rank: int, n: int) -> list[float]:
    losses = []
    for step in range(first, last):
        x, y = _batch(step)
        rows = slice(rank * 8 // n, (rank + 1) * 8 // n)
        loss = torch.nn.functional.mse_loss(model(x[rows].to("pjrt")), y[rows].to("pjrt"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return losses


def run_all() -> dict:
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    path = f"/tmp/pjrt-dcp-{os.environ['MASTER_PORT']}"
    out: dict = {}
    # bit for bit only where each graph runs one program whenever its compile finished
    # (tiered execution switches programs mid-run otherwise: docs/compile-cost.md)
    torch.use_deterministic_algorithms(True)
    try:
        with torch_pjrt.set_eager_mode("fused"):
            model, opt = _model(n)
            first = _steps(model, opt, 0, STOP, rank, n)
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
            out["uninterrupted"] = first + _steps(model, opt, STOP, STEPS, rank, n)
            out["files"] = sorted(os.listdir(path))
            model, opt = _model(n)  # a new process would start from here
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
            out["resumed"] = first + _steps(model, opt, STOP, STEPS, rank, n)
            out["shard_device"] = str(next(iter(model.parameters())).to_local().device)
    except Exception:  # noqa: BLE001 - reported
        out["error"] = traceback.format_exc(limit=-10)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.destroy_process_group()
    return out
