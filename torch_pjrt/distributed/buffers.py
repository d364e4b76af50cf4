"""pjrt tensors as the flat XLA buffers collectives take, and their results written back.

A tensor that is its whole storage, densely, hands its storage's buffer over and gets
the collective's result buffer in its place (no copy); any other view is read into a
dense buffer first and written back with copy_.
"""

from __future__ import annotations

import jax
import torch

from ..eager import dispatch, graph
from ..storage import dtypes, table, views


def settle() -> None:
    """Run the pending fused graph: a collective is its own program, never part of a
    graph, so ranks cutting their graphs differently cannot disagree on collectives."""
    if graph.pending:
        graph.flush("collective")


def _whole(t: torch.Tensor, rec: table.StorageRecord) -> bool:
    return (t.storage_offset() == 0 and views.is_contiguous(t.shape, t.stride())
            and rec.dtype == dtypes.to_jax(t.dtype) and rec.numel == t.numel())


def flat(t: torch.Tensor) -> jax.Array:
    """`t`'s elements as a dense 1-D buffer."""
    if not t.numel():
        return _empty(t)
    value = dispatch.dense_buffer(t)
    return value if value.ndim == 1 else value.reshape(-1)


def _empty(t: torch.Tensor) -> jax.Array:
    return table._zeros(0, dtypes.to_jax(t.dtype), t.device.index or 0)


def write(t: torch.Tensor, value: jax.Array) -> None:
    """`t`'s elements := the flat buffer `value` (as many elements, its dtype)."""
    if not t.numel():
        return
    rec = table.record_of(t)
    if _whole(t, rec) and type(rec.value) is not graph.Lazy:
        rec.set(value)
        return
    t.copy_(wrap(value, t.shape, t.dtype, t.device.index))


def wrap(value: jax.Array, shape, dtype: torch.dtype, device: int) -> torch.Tensor:
    """A new contiguous pjrt tensor holding the flat buffer `value`."""
    shape = tuple(shape)
    return table.empty_strided(shape, views.contiguous_strides(shape), dtype, device,
                               value=value)
