"""Ops whose output shape depends on data, lowered with a static upper bound.

`pjrt::nonzero_padded(x, size)` returns `size` rows of indices (the nonzeros
first, then padding); the eager kernel reads the true count (a sync) and
returns a view of the first `count` rows, so one program serves every count
in a power-of-two bucket.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .. import checks
from ..registry import lower

_lib = torch.library.Library("pjrt", "DEF")
_lib.define("nonzero_padded(Tensor self, int size) -> Tensor")


@torch.library.register_fake("pjrt::nonzero_padded", lib=_lib)
def _nonzero_padded_meta(x, size):
    return x.new_empty((size, x.dim()), dtype=torch.long)


@lower(torch.ops.pjrt.nonzero_padded.default)
def nonzero_padded(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    idx = jnp.nonzero(x, size=size, fill_value=0)
    return jnp.stack(idx, axis=1).astype(jnp.int64)


# ------------------------------------------------------------------- unique
# Every unique_* op is one program that returns its outputs padded to the input's
# length plus the true count; the eager kernel (torch_pjrt.eager.dynamic) reads
# the count (a sync) and returns the leading part.
_lib.define("unique_padded(Tensor self, bool consecutive) -> (Tensor, Tensor, Tensor, Tensor)")
_lib.define("unique_dim_padded(Tensor self, int dim, bool consecutive) "
            "-> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.register_fake("pjrt::unique_padded", lib=_lib)
def _unique_padded_meta(x, consecutive):
    n = x.numel()
    long = torch.long
    return (x.new_empty((n,)), x.new_empty(x.shape, dtype=long), x.new_empty((n,), dtype=long),
            x.new_empty((), dtype=long))


@torch.library.register_fake("pjrt::unique_dim_padded", lib=_lib)
def _unique_dim_padded_meta(x, dim, consecutive):
    n = x.shape[dim]
    long = torch.long
    return (x.new_empty(x.shape), x.new_empty((n,), dtype=long), x.new_empty((n,), dtype=long),
            x.new_empty((), dtype=long))


def _groups(rows, consecutive):
    """Rows (N, M) in group order, the permutation that sorted them, and each sorted row's
    group number: equal rows (NaN never equals NaN) form a group, sorted ascending unless
    `consecutive`."""
    from .sorting import _order_key

    n = rows.shape[0]
    perm = jnp.arange(n, dtype=jnp.int64)
    if not consecutive and n and rows.shape[1]:
        keys = [_order_key(rows[:, j]) for j in range(rows.shape[1])]
        *_, perm = lax.sort((*keys, perm), num_keys=len(keys), is_stable=True)
        rows = rows[perm]
    differs = jnp.any(rows[1:] != rows[:-1], axis=1)
    starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), differs])
    group = jnp.cumsum(starts, dtype=jnp.int64) - 1
    return rows, perm, starts, group


def _unique_rows(rows, consecutive):
    n = rows.shape[0]
    rows, perm, starts, group = _groups(rows, consecutive)
    count = group[-1] + 1 if n else jnp.int64(0)
    first = jnp.where(starts, group, n)  # the first row of each group lands at its number
    values = jnp.zeros_like(rows).at[first].set(rows, mode="drop")
    inverse = jnp.zeros((n,), jnp.int64).at[perm].set(group)
    counts = jnp.zeros((n,), jnp.int64).at[group].add(1)
    return values, inverse, counts, count


@lower(torch.ops.pjrt.unique_padded.default)
def unique_padded(x, consecutive):
    values, inverse, counts, count = _unique_rows(x.reshape(-1, 1), consecutive)
    return values.reshape(-1), inverse.reshape(x.shape), counts, count


@lower(torch.ops.pjrt.unique_dim_padded.default)
def unique_dim_padded(x, dim, consecutive):
    moved = jnp.moveaxis(x, dim, 0)
    rows = moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))
    values, inverse, counts, count = _unique_rows(rows, consecutive)
    return jnp.moveaxis(values.reshape(moved.shape), 0, dim), inverse, counts, count


# ------------------------------------------------------- bincount, repeat_interleave
_lib.define("bincount_padded(Tensor self, int size) -> Tensor")
_lib.define("bincount_weighted_padded(Tensor self, Tensor weights, int size, ScalarType dtype) "
            "-> Tensor")
_lib.define("repeat_interleave_padded(Tensor repeats, int size, int? exact=None) -> Tensor")


@torch.library.register_fake("pjrt::bincount_padded", lib=_lib)
def _bincount_padded_meta(x, size):
    return x.new_empty((size,), dtype=torch.long)


@torch.library.register_fake("pjrt::bincount_weighted_padded", lib=_lib)
def _bincount_weighted_padded_meta(x, weights, size, dtype):
    return weights.new_empty((size,), dtype=dtype)


@torch.library.register_fake("pjrt::repeat_interleave_padded", lib=_lib)
def _repeat_interleave_padded_meta(repeats, size, exact=None):
    return repeats.new_empty((size,))


@lower(torch.ops.pjrt.bincount_padded.default)
def bincount_padded(x, size):
    return jnp.zeros((size,), jnp.int64).at[x].add(1, mode="drop")


@lower(torch.ops.pjrt.bincount_weighted_padded.default)
def bincount_weighted_padded(x, weights, size, dtype):
    acc = jnp.float32 if dtype == torch.float32 else jnp.float64
    return jnp.zeros((size,), acc).at[x].add(weights.astype(acc), mode="drop")


@lower(torch.ops.pjrt.repeat_interleave_padded.default)
def repeat_interleave_padded(repeats, size, exact=None):
    """Index i repeated repeats[i] times, then len(repeats) as padding up to `size`."""
    ends = jnp.cumsum(repeats.astype(jnp.int64))
    if exact is not None:
        total = ends[-1] if ends.size else jnp.int64(0)
        checks.require(total == exact, RuntimeError, "allocated size does not match required size")
    checks.require(jnp.all(repeats >= 0), RuntimeError, "repeats can not be negative")
    marks = jnp.zeros((size,), jnp.int64).at[ends].add(1, mode="drop")
    return jnp.cumsum(marks)
