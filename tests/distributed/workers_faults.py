"""Rank code of test_faults.py: collectives that the ranks call differently, or that one
rank never calls, raise on every rank that called them, within the group's timeout."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT_S = 3


def _outcome(fn) -> dict:
    """What fn() raised (type, message, seconds it took), or 'returned'."""
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the outcome is what is checked
        return {"raised": type(e).__name__, "is_dist_error": isinstance(e, dist.DistBackendError),
                "message": str(e), "seconds": time.monotonic() - start}
    return {"raised": None, "seconds": time.monotonic() - start}


def _group():
    """A new group of both ranks (each case breaks its own)."""
    return dist.new_group(timeout=timedelta(seconds=TIMEOUT_S))


def mismatches() -> dict:
    dist.init_process_group("pjrt", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    x = torch.ones(4, device="pjrt")
    out: dict = {}
    g = _group()
    # Shapes: rank 1 passes five elements.
    y = torch.ones(4 + rank, device="pjrt")
    out["shape"] = _outcome(lambda: dist.all_reduce(y, group=g))
    out["shape_value"] = y.cpu().tolist()  # untouched: nothing was reduced
    g = _group()
    z = torch.ones(4, device="pjrt", dtype=torch.float32 if rank == 0 else torch.bfloat16)
    out["dtype"] = _outcome(lambda: dist.all_reduce(z, group=g))
    g = _group()
    out["op"] = _outcome(lambda: dist.all_reduce(x, group=g) if rank == 0 else
                         dist.broadcast(x, 0, group=g))
    g = _group()
    out["reduce_op"] = _outcome(lambda: dist.all_reduce(
        x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX, group=g))
    g = _group()
    # Rank 1 raised in its own code and never calls this one; it waits for rank 0 on
    # the world group afterwards.
    out["missing"] = _outcome(lambda: dist.all_reduce(x, group=g)) if rank == 0 else None
    out["after"] = _outcome(lambda: dist.all_reduce(x, group=g)) if rank == 0 else None
    dist.barrier()
    w = torch.full((2,), float(rank + 1), device="pjrt")
    dist.all_reduce(w)  # the world group is still good
    out["world_after"] = w.cpu().tolist()
    dist.destroy_process_group()
    return out


def dead_rank() -> dict:
    dist.init_process_group("pjrt", timeout=timedelta(seconds=TIMEOUT_S))
    x = torch.ones(4, device="pjrt")
    dist.all_reduce(x)
    if dist.get_rank() == 1:
        os._exit(3)  # dies without a word
    out = {"first": x.cpu().tolist()}
    out["second"] = _outcome(lambda: dist.all_reduce(x))
    out["exit_at_once"] = True
    return out
