"""Indexing: index, index_put, index_select, gather, scatter and friends.

Indices are checked on the device (lowering.checks): an out-of-range index
raises IndexError / RuntimeError at the next synchronization, never clamps.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..checks import index_dtype, index_in_range, index_nonnegative, require
from ..registry import lower
from ._ops import aten

_MASKS = (jnp.bool_, jnp.uint8)  # index dtypes PyTorch reads as masks
_INT32_64 = (jnp.int32, jnp.int64)


def _is_mask(i) -> bool:
    return i is not None and i.dtype in _MASKS


def _advanced_index(x, indices):
    """x[indices] for PyTorch's list of optional integer index tensors (eager turns masks
    into integer indices before they reach the device; index_put takes them as they are)."""
    idx = []
    for d, i in enumerate(indices):
        if i is not None:
            index_dtype(i, (*_INT32_64, *_MASKS), IndexError,
                        "tensors used as indices must be long, int, byte or bool tensors")
        if i is None:
            idx.append(slice(None))
        elif _is_mask(i):  # 0/1 as positions would be a silent wrong result
            raise RuntimeError(f"pjrt: a boolean mask index (dimension {d}) reached a lowering "
                               "whose result shape depends on it; index with integer indices")
        else:
            idx.append(index_in_range(i.astype(jnp.int64), x.shape[d], d))
    return tuple(idx)


@lower(aten.index.Tensor)
def index(x, indices):
    return x[_advanced_index(x, indices)]


def _masked_put_index(x, indices, values):
    """(index tuple, values) for index_put with masks at static shapes (as torch.compile
    graphs have them): each mask of k dimensions becomes k coordinate arrays of the mask's
    size, the true coordinates first, the rest one past the end of their dimension (dropped
    by the scatter); `values`, broadcast to the indexed shape, gets its count axis padded
    to match."""
    idx, d, count, slots, masked = [], 0, None, None, range(0)
    for i in indices:
        if i is None:
            idx.append(slice(None))
            d += 1
        elif _is_mask(i):
            if i.ndim == 0 or count is not None:
                raise RuntimeError("pjrt: index_put with a 0-d mask or several masks under "
                                   "torch.compile is not supported (it is in eager mode)")
            mask = i.astype(jnp.bool_)
            slots, count = mask.size, jnp.sum(mask)
            ends = tuple(x.shape[d:d + mask.ndim])
            masked = range(len(idx), len(idx) + mask.ndim)
            idx.extend(jnp.nonzero(mask, size=slots, fill_value=ends))
            d += mask.ndim
        else:
            idx.append(index_in_range(i.astype(jnp.int64), x.shape[d], d))
            d += 1
    arrays = [k for k, v in enumerate(idx) if not isinstance(v, slice)]
    for k in arrays[:]:  # integer indices broadcast with the count (their last axis)
        i = idx[k]
        if k not in masked and i.ndim and i.shape[-1] != 1:
            require(i.shape[-1] == count, IndexError,
                    f"shape mismatch: indexing tensors could not be broadcast together "
                    f"(an index of shape {list(i.shape)} and a mask's count of True)")
            pad = [(0, 0)] * (i.ndim - 1) + [(0, max(slots - i.shape[-1], 0))]
            idx[k] = jnp.pad(i, pad, constant_values=x.shape[k])
    adjacent = arrays == list(range(arrays[0], arrays[-1] + 1))
    shape = jnp.broadcast_shapes(*(idx[k].shape for k in arrays))
    rest = [n for k, n in enumerate(x.shape) if k >= len(idx) or isinstance(idx[k], slice)]
    first = arrays[0] if adjacent else 0
    out_shape = (*rest[:first], *shape, *rest[first:])
    axis = first + len(shape) - 1  # the count axis (masks give 1-d coordinate arrays)
    from_right = len(out_shape) - 1 - axis
    if values.ndim > from_right and values.shape[values.ndim - 1 - from_right] != 1:
        v_axis = values.ndim - 1 - from_right
        require(values.shape[v_axis] == count, RuntimeError,
                f"shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                "broadcast to the indexing result (the mask's count of True)")
        pad = [(0, 0)] * values.ndim
        pad[v_axis] = (0, max(slots - values.shape[v_axis], 0))
        values = jnp.pad(values, pad)
    return tuple(idx), jnp.broadcast_to(values, out_shape)


@lower(aten.index_put.default, promote="result", operands=("self", "values"))
def index_put(x, indices, values, accumulate=False):
    for i in indices:
        if i is not None:
            index_dtype(i, (*_INT32_64, *_MASKS), IndexError,
                        "tensors used as indices must be long, int, byte or bool tensors")
    if accumulate and x.dtype == jnp.bool_:
        # the CPU accumulates booleans as a logical or (XLA has no boolean add): counted
        # in int32, any count above zero is true
        counts = index_put(x.astype(jnp.int32), indices, values.astype(jnp.int32), True)
        return counts > 0
    if any(_is_mask(i) for i in indices):
        idx, values = _masked_put_index(x, indices, values)
        if accumulate:
            return x.at[idx].add(values, mode="drop")
        return x.at[idx].set(values, mode="drop")
    idx = _advanced_index(x, indices)
    if accumulate:
        return x.at[idx].add(values)
    return x.at[idx].set(values)


@lower(aten._unsafe_index_put.default, promote="result", operands=("self", "values"))
def unsafe_index_put(x, indices, values, accumulate=False):
    return index_put(x, indices, values, accumulate)


@lower(aten.index_select.default)
def index_select(x, dim, index):
    # Unlike indexing, index_select takes no negative index (the CPU's message); a 0-d
    # input gives a 0-d result (the index must be [0]).
    index_dtype(index, _INT32_64, RuntimeError,
                "index_select(): Expected dtype int32 or int64 for index")
    i = index_nonnegative(index.astype(jnp.int64), x.shape[dim] if x.ndim else 1, IndexError,
                          "index out of range in self")
    return x if x.ndim == 0 else jnp.take(x, i.reshape(-1), axis=dim)


def _check_gather_index(index, size, dim):
    # gather and scatter take no negative index (the CPU and CUDA kernels' check)
    return index_nonnegative(index, size, RuntimeError,
                             f"index {{0}} is out of bounds for dimension {dim} with size {size}")


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
        _check_gather_index(index.astype(jnp.int64), 1, 0)
        return x.reshape(index.shape)
    if index.ndim == 0:  # PyTorch counts a 0-d index as 1-d (a 1-d self): a 0-d result
        return gather(x, dim, index.reshape(1)).reshape(())
    dim = dim % x.ndim
    i = _check_gather_index(index.astype(jnp.int64), x.shape[dim], dim)
    return x[_along(i, x.shape, dim)]


def _scatter(x, dim, index, src, mode):
    if index.size == 0:
        return x
    if x.dtype == jnp.bool_:  # the CPU's bool sum is an or, its product an and
        mode = {"add": "amax", "multiply": "amin"}.get(mode, mode)
    if x.ndim == 0:
        _check_gather_index(index.astype(jnp.int64), 1, 0)
        src = jnp.broadcast_to(src, index.shape).reshape(-1)[:1].reshape(())
        return {"set": src, "add": x + src, "multiply": x * src, "amax": jnp.maximum(x, src),
                "amin": jnp.minimum(x, src)}[mode]
    if index.ndim == 0:  # as gather: a 0-d index counts as 1-d
        index = index.reshape(1)
        src = src if jnp.ndim(src) == 0 else src.reshape(-1)[:1]
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
        if x.dtype == jnp.bool_:
            identity = mode in ("multiply", "amin")
        elif mode in ("amax", "amin") and not jnp.issubdtype(x.dtype, jnp.floating):
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
    index_dtype(index, _INT32_64, RuntimeError,
                "index_add_(): Expected dtype int32/int64 for index but got: {0}")
    _check_slices(x, dim, source)
    # no negative index (the CPU's kernels): its 0-d and 1-d kernel says IndexError, the
    # other RuntimeError naming the index
    size = x.shape[dim % x.ndim] if x.ndim else 1
    if x.ndim <= 1:
        i = index_nonnegative(index.astype(jnp.int64), size, IndexError,
                              "index out of range in self")
    else:
        i = index_nonnegative(index.astype(jnp.int64), size, RuntimeError,
                              f"index {{0}} is out of bounds for dimension {dim % x.ndim} "
                              f"with size {size}")
    if x.ndim == 0:
        return x + alpha * jnp.sum(source)
    dim = dim % x.ndim
    where = (slice(None),) * dim + (i,)
    return x.at[where].add(alpha * source)


@lower(aten.index_copy.default, promote="result", operands=("self", "source"))
def index_copy(x, dim, index, source):
    index_dtype(index, (jnp.int64,), RuntimeError,
                "index_copy_(): Expected a long tensor for index, but got {0}")
    size = x.shape[dim % x.ndim] if x.ndim else 1
    i = index_nonnegative(index.astype(jnp.int64), size, IndexError,
                          f"index_copy_(): index {{0}} is out of bounds for dimension "
                          f"{dim % max(x.ndim, 1)} with size {size}")
    if x.ndim == 0:
        return source.reshape(())
    dim = dim % x.ndim
    # a 0-d index or source stands for one element (the CPU's kernel reads them so)
    i = i.reshape(-1)
    if source.ndim == 0 and x.ndim == 1:
        source = source.reshape(1)
    return x.at[(slice(None),) * dim + (i,)].set(source)


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, promote="result",
       operands=("self", "value"))
def index_fill(x, dim, index, value):
    index_dtype(index, (jnp.int64,), IndexError, "index_fill_(): Expected dtype int64 for index.")
    if x.ndim == 0:
        index_in_range(index.astype(jnp.int64), 1, 0)
        return jnp.where(index.size > 0, value, x).astype(x.dtype)
    dim = dim % x.ndim
    i = index_in_range(index.astype(jnp.int64), x.shape[dim], dim)
    return x.at[(slice(None),) * dim + (i,)].set(value)


@lower(aten._unsafe_masked_index.default)
def unsafe_masked_index(x, mask, indices, fill, *, meta):
    # x[indices] where mask holds, fill elsewhere (the padding decompositions' gather). An
    # index under a False mask may lie anywhere; under a True one a negative index wraps,
    # as in the CPU's kernel (torch._decomp's decomposition clamps it to 0 instead).
    for i in indices:
        if i is not None:
            index_dtype(i, _INT32_64, RuntimeError,
                        "tensors used as indices must be long or int tensors")
    if x.size == 0:
        return jnp.full(meta[0].shape, fill, x.dtype)
    idx = tuple(slice(None) if i is None else
                jnp.clip(jnp.where(i < 0, i + n, i).astype(jnp.int64), 0, n - 1)
                for i, n in zip(indices, x.shape))
    return jnp.where(mask, x[idx], jnp.asarray(fill, x.dtype)).astype(x.dtype)
