"""Waiting for the device: what torch.pjrt.synchronize() does."""

from __future__ import annotations

from ..lowering import checks
from ..storage import table


def synchronize(device: int | None = None) -> None:
    """Run any pending fused graph and block until every live buffer is computed."""
    from ..eager import graph

    graph.flush("synchronize")
    for rec in table.live_records():
        value = rec.value  # (a graph.Lost, of a graph that failed, has nothing to wait for)
        if value is not None and not getattr(value, "pending", False) and \
                (device is None or rec.device == device):
            value.block_until_ready()
    checks.raise_pending()


def drain() -> None:
    """At interpreter exit: wait for the programs still running (their outputs' buffers),
    without running the pending graph or reporting its errors. A program still running
    while the process exits can be inside a libtorch kernel (the cpu platform's custom
    calls) as libtorch's static objects are destroyed: a segfault at exit."""
    for rec in table.live_records():
        value = rec.value
        if value is not None and not getattr(value, "pending", False):
            try:
                value.block_until_ready()
            except Exception:  # noqa: BLE001 - exiting: a failed program has nothing to wait for
                pass
