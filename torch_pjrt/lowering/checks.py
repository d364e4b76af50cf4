"""Device-side checks: errors that depend on data (an index out of range, a bad target).

A lowering calls `require(ok, error, message, *values)` while it is traced; the
program then also returns, per check, whether it failed and the values at the
first failure (for messages that name them, as PyTorch's do). The executor queues these flags
and they are read at the next synchronization point (.item(), .cpu(),
synchronize(), or right after the op in debug mode) and raised as PyTorch's
error, naming the op, as CUDA reports a device-side assert at the next sync.
Inside a torch.compile graph the op is the graph's node (`op_scope`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax.numpy as jnp
from jax import lax


class _Tracing(threading.local):
    """What the thread is tracing: programs are traced on the user's thread and on the
    compile threads (runtime/compile_pool.py) at once."""

    checks: list | None = None  # the checks of the program being traced
    op: str | None = None  # the op being traced inside a larger program (a compiled graph)


_state = _Tracing()


class CheckCollector:
    """Collects the checks of one trace (a context manager used by the executor)."""

    def __init__(self):
        # (bad: traced bool, values: [traced int64], kinds, exception type, message, op)
        self.checks: list[tuple] = []

    def __enter__(self):
        self._prev = _state.checks
        _state.checks = self.checks
        return self

    def __exit__(self, *exc):
        _state.checks = self._prev
        return False

    def infos(self) -> list[tuple] | None:
        """(exception type, message, op or None, kinds of its values) of each check, or None
        without checks: what the executor keeps next to the program (and on disk with it)."""
        return [(error, message, op, kinds)
                for _, _, kinds, error, message, op in self.checks] or None

    def flags(self):
        """The program's extra output: an int64 array, a row (failed, values...) per check."""
        width = 1 + max(len(values) for _, values, _, _, _, _ in self.checks)
        rows = []
        for bad, values, _, _, _, _ in self.checks:
            row = [bad.astype(jnp.int64), *values]
            rows.append(jnp.stack(row + [jnp.zeros((), jnp.int64)] * (width - len(row))))
        return jnp.stack(rows)


@contextlib.contextmanager
def op_scope(name: str) -> Iterator[None]:
    """Checks recorded inside name the op `name` (a node of a compiled graph)."""
    prev, _state.op = _state.op, name
    try:
        yield
    finally:
        _state.op = prev


def require(ok, error: type[Exception], message: str, *values) -> None:
    """Record that `ok` (a traced bool array) must hold, else raise `error(message)`.

    `message` may contain `{0}`, `{1}`, ...: the element of each of `values` (arrays
    broadcastable with `ok`, or numbers) at the first position where `ok` fails, written
    as PyTorch's C++ messages write them (a float to 6 significant digits)."""
    tracing = _state.checks
    if tracing is None:
        return
    ok = jnp.asarray(ok)
    bad = jnp.logical_not(jnp.all(ok))
    shown, kinds = [], ""
    for value in values:
        value = jnp.asarray(value)
        floating = jnp.issubdtype(value.dtype, jnp.floating)
        kinds += "f" if floating else "i"
        shape = jnp.broadcast_shapes(ok.shape, value.shape)
        first = jnp.zeros((), value.dtype)
        if 0 not in shape:
            flat_ok = jnp.broadcast_to(ok, shape).reshape(-1)
            first = jnp.broadcast_to(value, shape).reshape(-1)[jnp.argmin(flat_ok)]  # 1st False
        if floating:  # its float32 bits (float64 is not every device's)
            first = lax.bitcast_convert_type(first.astype(jnp.float32), jnp.int32)
        shown.append(first.astype(jnp.int64))
    tracing.append((bad, shown, kinds, error, message, _state.op))


_SCALAR_TYPE_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short",
                      "int32": "Int", "int64": "Long", "float16": "Half", "bfloat16": "BFloat16",
                      "float32": "Float", "float64": "Double", "complex64": "ComplexFloat",
                      "complex128": "ComplexDouble"}


def type_name(dtype) -> str:
    """PyTorch's name of a (JAX or torch) dtype in its messages: Float, Long, Byte, ..."""
    name = str(dtype).removeprefix("torch.")
    return _SCALAR_TYPE_NAMES.get(name, name)


_CPP_TYPE_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char",
                   "int16": "short int", "int32": "int", "int64": "long int",
                   "float16": "c10::Half", "bfloat16": "c10::BFloat16", "float32": "float",
                   "float64": "double", "complex64": "c10::complex<float>",
                   "complex128": "c10::complex<double>"}


def cpp_type_name(dtype) -> str:
    """The C++ name of a dtype, as the messages that print a tensor's dtype() give it."""
    name = str(dtype).removeprefix("torch.")
    return _CPP_TYPE_NAMES.get(name, name)


def index_in_range(index, size: int, dim: int):
    """Require -size <= index < size, as PyTorch does; returns the index made non-negative."""
    require((index >= -size) & (index < size), IndexError,
            f"index {{0}} is out of bounds for dimension {dim} with size {size}", index)
    return jnp.where(index < 0, index + size, index)


def index_nonnegative(index, size: int, error: type[Exception], message: str):
    """Require 0 <= index < size: the ops whose CPU and CUDA kernels take no negative index
    (gather, scatter, index_add, index_copy, index_select, index_reduce). `message` may name the
    index as {0}."""
    require((index >= 0) & (index < size), error, message, index)
    return index


def expect_dtype(x, dtype=jnp.int64) -> None:
    """Raise the CPU's and CUDA's error for an argument their kernel reads as one dtype only
    (`data_ptr<int64_t>()`: the targets of the margin losses, max pooling's indices, a
    loss's weight of another dtype than its input). Raised while tracing: the dtype is known
    before the data."""
    dtype = jnp.dtype(dtype)
    if x.dtype != dtype:
        raise RuntimeError(f"expected scalar type {type_name(dtype)} but found "
                           f"{type_name(x.dtype)}")


def index_dtype(index, accepted: tuple, error: type[Exception], message: str) -> None:
    """Raise `error(message)` where the index's dtype is not one of `accepted`, as the CPU's
    and CUDA's kernels check before they read it (`message` may name the dtype as {0}:
    Short, Float). Raised while tracing, so compiled graphs check it as eager calls do."""
    if index.dtype not in tuple(jnp.dtype(a) for a in accepted):
        raise error(message.replace("{0}", type_name(index.dtype)))


# ---------------------------------------------------------------- pending
_pending: list[tuple] = []  # (flags: jax.Array (n, 2), [(error, message, op)], op name)
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
        rows = np.asarray(flags)
        for row, (error, message, op, kinds) in zip(rows, infos):
            if row[0]:
                _pending.clear()
                where = op_name if op is None else f"{op}, in {op_name}"
                raise error(f"{_format(message, row[1:], kinds)} (in {where}; pjrt reports "
                            "device-side errors at the next synchronization, set "
                            "TORCH_PJRT_EAGER_MODE=debug to stop at the op)")


def raise_ready() -> None:
    """Raise the first failure among the queued checks whose flags are computed, without
    waiting: the checks of work still running stay queued for a later synchronization.
    (A read of one tensor while later work runs: its program's checks are computed.)"""
    done = [entry[0].is_ready() for entry in _pending]
    if any(done):
        ready = [entry for entry, d in zip(_pending, done) if d]
        _pending[:] = ready + [entry for entry, d in zip(_pending, done) if not d]
        raise_pending(len(ready))


def _format(message: str, values, kinds: str) -> str:
    import numpy as np

    for i, kind in enumerate(kinds):
        v = int(values[i])
        text = f"{float(np.int32(v).view(np.float32)):g}" if kind == "f" else str(v)
        message = message.replace(f"{{{i}}}", text)
    return message
