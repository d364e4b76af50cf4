"""Device-side checks: errors that depend on data (an index out of range).

A lowering calls `require(ok, error, message)` while it is traced; the program
then also returns "is anything wrong" as a boolean. The executor queues it and
the check is read at the next synchronization point (.item(), .cpu(),
synchronize(), or right away in debug mode) and raised as PyTorch's error,
as CUDA reports a device-side assert at the next sync.
"""

from __future__ import annotations

import jax.numpy as jnp

_tracing: list | None = None  # the checks of the program being traced


class CheckCollector:
    """Collects the checks of one trace (a context manager used by the executor)."""

    def __init__(self):
        self.checks: list[tuple] = []  # (bad: traced bool, exception type, message)

    def __enter__(self):
        global _tracing
        self._prev = _tracing
        _tracing = self.checks
        return self

    def __exit__(self, *exc):
        global _tracing
        _tracing = self._prev
        return False


def require(ok, error: type[Exception], message: str) -> None:
    """Record that `ok` (a traced bool array) must hold, else raise `error(message)`."""
    if _tracing is None:
        return
    _tracing.append((jnp.logical_not(jnp.all(ok)), error, message))


def index_in_range(index, size: int, dim: int):
    """Require -size <= index < size, as PyTorch does; returns the index made non-negative."""
    require((index >= -size) & (index < size), IndexError,
            f"index out of range for dimension {dim} with size {size}")
    return jnp.where(index < 0, index + size, index)


# ---------------------------------------------------------------- pending
_pending: list[tuple] = []  # (flags: jax.Array of bools, [(error, message)], op name)
_MAX_PENDING = 256


def defer(flags, infos: list[tuple], op_name: str) -> None:
    """Queue an op's check flags until the next synchronization point."""
    _pending.append((flags, infos, op_name))
    if len(_pending) > _MAX_PENDING:
        raise_pending(len(_pending) // 2)


def raise_pending(limit: int | None = None) -> None:
    """Read queued check flags (waiting for them) and raise the first failure."""
    import numpy as np

    n = len(_pending) if limit is None else limit
    batch, _pending[:n] = _pending[:n], []
    for flags, infos, op_name in batch:
        bad = np.asarray(flags)
        for failed, (error, message) in zip(bad, infos):
            if failed:
                _pending.clear()
                raise error(f"{message} (in {op_name}; pjrt reports device-side errors at the "
                            "next synchronization, set TORCH_PJRT_EAGER_MODE=debug to stop at "
                            "the op)")
