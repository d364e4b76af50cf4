"""Indexing: index, index_put, index_select, gather, scatter and friends.

Indices are checked on the device (lowering.checks): an out-of-range index
raises IndexError / RuntimeError at the next synchronization, never clamps.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..checks import index_in_range, require
from ..registry import lower
from ._ops import aten


def _advanced_index(x, indices):
    """x[indices] for PyTorch's list of optional integer index tensors (bools become ints
    before they reach the device)."""
    idx = []
    for d, i in enumerate(indices):
        if i is None:
            idx.append(slice(None))
        else:
            idx.append(index_in_range(i.astype(jnp.int64), x.shape[d], d))
    return tuple(idx)


@lower(aten.index.Tensor)
def index(x, indices):
    return x[_advanced_index(x, indices)]


@lower(aten.index_put.default, promote="result", operands=("self", "values"))
def index_put(x, indices, values, accumulate=False):
    idx = _advanced_index(x, indices)
    if accumulate:
        return x.at[idx].add(values)
    return x.at[idx].set(values)


@lower(aten._unsafe_index_put.default, promote="result", operands=("self", "values"))
def unsafe_index_put(x, indices, values, accumulate=False):
    return index_put(x, indices, values, accumulate)


@lower(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:  # PyTorch: a 0-d input gives a 0-d result (index must be [0])
        index_in_range(index, 1, 0)
        return x
    i = index_in_range(index.astype(jnp.int64), x.shape[dim], dim)
    return jnp.take(x, i.reshape(-1), axis=dim)


def _check_gather_index(index, size, dim):
    require((index >= -size) & (index < size), RuntimeError,
            f"index out of range in gather/scatter along dimension {dim} with size {size}")
    return jnp.where(index < 0, index + size, index)


def _along(index, x_shape, dim):
    """Full index tuple for take/put along `dim` with index shaped like the output."""
    idx = []
    for d in range(len(index.shape)):
        if d == dim:
            idx.append(index)
        else:
            shape = [1] * index.ndim
            shape[d] = index.shape[d]
            idx.append(jnp.arange(index.shape[d]).reshape(shape))
    return tuple(idx)


@lower(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    if index.size == 0:  # PyTorch skips the shape checks of an empty index
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(index.shape)
    dim = dim % x.ndim
    i = _check_gather_index(index.astype(jnp.int64), x.shape[dim], dim)
    return x[_along(i, x.shape, dim)]


def _scatter(x, dim, index, src, mode):
    if index.size == 0:
        return x
    if x.ndim == 0:
        src = jnp.broadcast_to(src, index.shape).reshape(-1)[:1].reshape(())
        return {"set": src, "add": x + src, "multiply": x * src, "amax": jnp.maximum(x, src),
                "amin": jnp.minimum(x, src)}[mode]
    dim = dim % x.ndim
    i = _check_gather_index(index.astype(jnp.int64), x.shape[dim], dim)
    src = jnp.broadcast_to(src, index.shape) if jnp.ndim(src) == 0 else \
        src[tuple(slice(0, n) for n in index.shape)]
    where = _along(i, x.shape, dim)
    ref = x.at[where]
    if mode == "set":
        return ref.set(src)
    if mode == "add":
        return ref.add(src)
    if mode == "multiply":
        return ref.multiply(src)
    if mode == "amax":
        return ref.max(src)
    if mode == "amin":
        return ref.min(src)
    raise ValueError(mode)


@lower(aten.scatter.src, aten.scatter.value, promote="result", operands=("self", "src", "value"))
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lower(aten.scatter.reduce, aten.scatter.value_reduce, promote="result",
       operands=("self", "src", "value"))
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, "add" if reduce == "add" else "multiply")


@lower(aten.scatter_add.default, promote="result", operands=("self", "src"))
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lower(aten.scatter_reduce.two, promote="result", operands=("self", "src"))
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    mode = {"sum": "add", "prod": "multiply", "amax": "amax", "amin": "amin", "mean": "add"}[reduce]
    if not include_self:
        identity = {"add": 0, "multiply": 1, "amax": -jnp.inf, "amin": jnp.inf}[mode]
        if mode in ("amax", "amin") and not jnp.issubdtype(x.dtype, jnp.floating):
            info = jnp.iinfo(x.dtype)
            identity = info.min if mode == "amax" else info.max
        touched = _scatter(jnp.zeros(x.shape, jnp.bool_), dim, index, True, "set")
        base = jnp.where(touched, jnp.asarray(identity, x.dtype), x)
    else:
        base = x
    out = _scatter(base, dim, index, src, mode)
    if reduce == "mean":
        ones = jnp.ones(index.shape, x.dtype)
        counts = _scatter(jnp.zeros(x.shape, x.dtype), dim, index, ones, "add")
        counts = counts + (1 if include_self else 0)
        safe = jnp.maximum(counts, 1)
        mean = out / safe if jnp.issubdtype(x.dtype, jnp.floating) else out // safe
        out = jnp.where(counts > 0, mean, x)
    return out


def _check_slices(x, dim, source) -> None:
    """The CPU's check that source and self agree outside `dim` (PyTorch's meta kernel for
    index_add, a Python decomposition, does not make it)."""
    wrapped = dim % max(x.ndim, 1)

    def sliced(shape):
        return [n for d, n in enumerate(shape) if d != wrapped]

    if sliced(x.shape) != sliced(source.shape):
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension. Got self.shape = {list(x.shape)} source.shape "
                           f"= {list(source.shape)}")


@lower(aten.index_add.default, promote="result", operands=("self", "source", "alpha"))
def index_add(x, dim, index, source, *, alpha=1):
    _check_slices(x, dim, source)
    if x.ndim == 0:
        return x + alpha * jnp.sum(source)
    dim = dim % x.ndim
    i = index_in_range(index.astype(jnp.int64), x.shape[dim], dim)
    where = (slice(None),) * dim + (i,)
    return x.at[where].add(alpha * source)


@lower(aten.index_copy.default, promote="result", operands=("self", "source"))
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.reshape(())
    dim = dim % x.ndim
    i = index_in_range(index.astype(jnp.int64), x.shape[dim], dim)
    return x.at[(slice(None),) * dim + (i,)].set(source)


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, promote="result",
       operands=("self", "value"))
def index_fill(x, dim, index, value):
    if x.ndim == 0:
        return jnp.where(index.size > 0, value, x).astype(x.dtype)
    dim = dim % x.ndim
    i = index_in_range(index.astype(jnp.int64), x.shape[dim], dim)
    return x.at[(slice(None),) * dim + (i,)].set(value)
