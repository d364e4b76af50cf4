"""Waiting for the device: what torch.pjrt.synchronize() does, in steps that the layers
above the runtime add (the runtime holds no graphs, storages or device-side checks)."""

from __future__ import annotations

from collections.abc import Callable

from . import device_trace, watch

# What synchronize() runs, in this order, each list in the order the steps were added:
_before: list[Callable[[], None]] = []  # launch work still pending (a fused graph)
_wait: list[Callable[[int | None, bool], None]] = []  # (device, quiet): block until
# computed; quiet: a failed program is not reported
_after: list[Callable[[], None]] = []  # raise errors the work found (device-side checks)


def on_synchronize(*, before: Callable[[], None] | None = None,
                   wait: Callable[[int | None, bool], None] | None = None,
                   after: Callable[[], None] | None = None) -> None:
    """Add steps to synchronize(): `before` launches pending work, `wait(device, quiet)`
    blocks until the work on `device` (None: every device) is done, `after` raises the
    errors it found. drain() runs only the `wait` steps."""
    for steps, step in ((_before, before), (_wait, wait), (_after, after)):
        if step is not None:
            steps.append(step)


def synchronize(device: int | None = None) -> None:
    """Run any pending fused graph, block until every live buffer is computed and raise
    the device-side errors found."""
    for step in _before:
        step()
    watch.synced("synchronize")
    began = device_trace.now() if watch.profiling else 0
    for wait in _wait:
        wait(device, False)
    if began:
        device_trace.host("pjrt sync: synchronize", began)
    for step in _after:
        step()


def drain() -> None:
    """At interpreter exit: wait for the programs still running (their outputs' buffers),
    without running the pending graph or reporting its errors. A program still running
    while the process exits can be inside a libtorch kernel (the cpu platform's custom
    calls) as libtorch's static objects are destroyed: a segfault at exit."""
    for wait in _wait:
        wait(None, True)
