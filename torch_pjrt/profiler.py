"""`torch_pjrt.profiler.trace(dir)`: XLA's own profile of a region of code.

torch.profiler (with ProfilerActivity.PrivateUse1) shows each program torch-pjrt runs as
one device event; this shows what XLA does inside them, op by op, in the JAX profiler's
format (`<dir>/plugins/profile/<run>/*.xplane.pb`), which TensorBoard's profile plugin
reads and Perfetto opens. HLO ops carry the ATen op they came from in their metadata
(`op_name="3:aten.mm.default/..."`), and programs are named as profiles and dumps name
them. See docs/observability.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["trace"]


@contextlib.contextmanager
def trace(log_dir: str, *, create_perfetto_trace: bool = False) -> Iterator[str]:
    """Record XLA's profile of the code in the `with` block into `log_dir`.

    Work queued before the block is finished first, and the block's own work is waited for
    at its end, so that the profile holds exactly the block's programs.
    `create_perfetto_trace`: also write a Perfetto trace (`perfetto_trace.json.gz`)."""
    import jax
    import torch

    from . import runtime

    runtime.ensure_initialized()
    torch.pjrt.synchronize()
    jax.profiler.start_trace(log_dir, create_perfetto_trace=create_perfetto_trace)
    try:
        yield log_dir
    finally:
        try:
            torch.pjrt.synchronize()
        finally:
            jax.profiler.stop_trace()
