"""Rank code of test_ddp.py: DistributedDataParallel on pjrt against one process running
the global batch on the CPU."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_pjrt

TOL = 2e-5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 16)
        self.c = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(4, 4)  # never called

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def _batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)


def _reference(steps: int, micro: int = 1):
    """Single process, global batch, CPU: the losses and final parameters of SGD."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = _batch(step * micro + m)
            loss = torch.nn.functional.mse_loss(model(x), y) / micro
            loss.backward()
        losses.append(loss.item() * micro)
        opt.step()
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def _train(steps: int, micro: int = 1, compiled: bool = False, **ddp_kwargs):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net().to("pjrt")
    ddp = DDP(model, **ddp_kwargs)
    run = torch.compile(ddp, backend="pjrt") if compiled else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = _batch(step * micro + m)
            rows = slice(rank * 8 // n, (rank + 1) * 8 // n)
            x, y = x[rows].to("pjrt"), y[rows].to("pjrt")
            sync = ddp.no_sync() if m < micro - 1 else _nullcontext()
            with sync:
                loss = torch.nn.functional.mse_loss(run(x), y) / micro
                loss.backward()
        total = loss.detach() * micro
        dist.all_reduce(total)
        losses.append(total.item() / n)
        opt.step()
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _compare(got, want) -> str | None:
    (losses, params), (ref_losses, ref_params) = got, want
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        if abs(a - b) > TOL * max(1.0, abs(b)):
            return f"loss of step {i}: {a} vs {b}"
    for k in ref_params:
        diff = (params[k] - ref_params[k]).abs().max().item()
        if diff > TOL:
            return f"parameter {k} differs by {diff}"
    return None


CASES = {
    "plain": dict(steps=3, find_unused_parameters=True),
    "small_buckets": dict(steps=3, find_unused_parameters=True, bucket_cap_mb=0.0005),
    "no_sync": dict(steps=2, micro=2, find_unused_parameters=True),
    "static_graph": dict(steps=3, static_graph=True),
    "compiled": dict(steps=3, compiled=True, find_unused_parameters=True),
}
MODES = ("strict", "fused")
NAMES = [f"{mode}:{case}" for mode in MODES for case in CASES
         if case != "compiled" or mode == "fused"]  # compiled graphs run alone in any mode


def run_all() -> dict:
    dist.init_process_group("pjrt", timeout=timedelta(seconds=60))
    results = dict.fromkeys(NAMES, "not run: an earlier case raised")
    refs = {}
    try:
        for mode in MODES:
            with torch_pjrt.set_eager_mode(mode):
                for case, kw in CASES.items():
                    if f"{mode}:{case}" not in results:
                        continue
                    kw = dict(kw)
                    steps, micro = kw.pop("steps"), kw.pop("micro", 1)
                    key = (steps, micro)
                    if key not in refs:
                        refs[key] = _reference(steps, micro)
                    got = _train(steps, micro, **kw)
                    results[f"{mode}:{case}"] = _compare(got, refs[key]) or "ok"
    except Exception:  # noqa: BLE001 - reported as that case's outcome
        results[f"{mode}:{case}"] = traceback.format_exc(limit=-8)
        return results
    results["cpu_fallbacks"] = str(torch_pjrt.metrics()["cpu_fallbacks"])
    dist.destroy_process_group()
    return results
