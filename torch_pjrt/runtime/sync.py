"""Waiting for the device: what torch.pjrt.synchronize() does."""

from __future__ import annotations

from ..lowering import checks
from ..storage import table


def synchronize(device: int | None = None) -> None:
    """Run any pending fused graph and block until every live buffer is computed."""
    from ..eager import graph

    graph.flush("synchronize")
    _wait_for_buffers(device)
    checks.raise_pending()


def drain() -> None:
    """At interpreter exit: wait for the programs still running (their outputs' buffers),
    without running the pending graph or reporting its errors. A program still running
    while the process exits can be inside a libtorch kernel (the cpu platform's custom
    calls) as libtorch's static objects are destroyed: a segfault at exit."""
    _wait_for_buffers(None, quiet=True)


def _wait_for_buffers(device: int | None, quiet: bool = False) -> None:
    """Block until every live computed buffer (on `device`, or all) is ready; `quiet`: a
    program that failed is not reported (exiting, it has nothing to wait for)."""
    for rec in table.live_records():
        value = rec.value  # (a graph.Lost, of a graph that failed, has nothing to wait for)
        if value is None or getattr(value, "pending", False) or \
                (device is not None and rec.device != device):
            continue
        try:
            value.block_until_ready()
        except Exception:
            if not quiet:
                raise
