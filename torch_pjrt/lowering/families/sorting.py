"""Sorting, order statistics, searching and counting: sort, topk, median, mode, searchsorted.

PyTorch orders NaN above every number and -0.0 equal to 0.0; XLA's comparator
is a total order with -0.0 < 0.0 and -NaN first. So every order here goes
through `_order_key`, an integer key on which plain integer order is PyTorch's
order. Sorts are always stable. Where PyTorch's CPU kernels pick among equal
elements in an unspecified order (std::sort / std::nth_element: the indices of
sort(stable=False) past 16 elements, of topk, kthvalue, median and nanmedian,
and mode's), values are the CPU's and the index is the first occurrence (for
mode, the last, as the CPU does for small inputs).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..checks import require, type_name
from ..registry import lower
from ._ops import aten

_INT_OF_WIDTH = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _order_key(x, descending: bool = False):
    """An integer array whose ascending order is PyTorch's order of `x` (reversed if
    `descending`): NaN largest, -0.0 == 0.0."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if _is_float(x):
        zero = jnp.zeros((), x.dtype)
        canon = jnp.where(jnp.isnan(x), jnp.asarray(np.nan, x.dtype), jnp.where(x == 0, zero, x))
        bits = lax.bitcast_convert_type(canon, _INT_OF_WIDTH[x.dtype.itemsize])
        # Negative floats order backwards as integers: flip all but the sign bit.
        x = jnp.where(bits < 0, bits ^ jnp.iinfo(bits.dtype).max, bits)
    return ~x if descending else x


def _iota(x, dim):
    return lax.broadcasted_iota(jnp.int64, x.shape, dim)


def _sort(x, dim, descending):
    """(values, int64 indices) of a stable sort along `dim`, in PyTorch's order."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    _, values, indices = lax.sort((_order_key(x, descending), x, _iota(x, dim)), dimension=dim,
                                  num_keys=1, is_stable=True)
    return values, indices


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lower(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    # PyTorch's CPU sort is stable whatever `stable` says.
    return _sort(x, dim, descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    moved = jnp.moveaxis(x, dim, -1)
    if k == 0:
        empty = moved[..., :0]
        return jnp.moveaxis(empty, -1, dim), jnp.moveaxis(empty.astype(jnp.int64), -1, dim)
    # lax.top_k (XLA's TopK) keeps the largest keys, lower index first among equals.
    _, idx = lax.top_k(_order_key(moved, descending=not largest), k)
    idx = idx.astype(jnp.int64)
    values = jnp.take_along_axis(moved, idx, axis=-1)
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(idx, -1, dim)


def _take(a, pos, dim, keepdim):
    """a[..., pos, ...] along dim; `pos` is an int or an array shaped like `a` reduced over dim
    (kept as size 1)."""
    if isinstance(pos, int):
        out = lax.slice_in_dim(a, pos, pos + 1, axis=dim)
    else:
        out = jnp.take_along_axis(a, pos, axis=dim)
    return out if keepdim else jnp.squeeze(out, dim)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    values, indices = _sort(x, dim, False)
    return _take(values, k - 1, dim, keepdim), _take(indices, k - 1, dim, keepdim)


def _nan_count(x, dim):
    if not _is_float(x):
        return jnp.zeros(x.shape[:dim] + (1,) + x.shape[dim + 1:], jnp.int64)
    return jnp.sum(jnp.isnan(x), axis=dim, keepdims=True, dtype=jnp.int64)


def _median_dim(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    n = x.shape[dim]
    values, indices = _sort(x, dim, False)  # NaNs last, in index order
    nans = _nan_count(x, dim)
    if ignore_nan:
        m = n - nans
        pos = jnp.where(m > 0, (m - 1) // 2, 0)
    else:  # any NaN is the median: the first one
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _take(values, pos, dim, keepdim), _take(indices, pos, dim, keepdim)


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, ignore_nan=False)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, ignore_nan=True)


@lower(aten.median.default)
def median(x):
    if x.size == 0:
        return jnp.full((), np.nan, x.dtype)
    return _median_dim(x.reshape(-1), 0, False, ignore_nan=False)[0]


@lower(aten.nanmedian.default)
def nanmedian(x):
    if x.size == 0:
        return jnp.full((), np.nan, x.dtype)
    return _median_dim(x.reshape(-1), 0, False, ignore_nan=True)[0]


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the index of
    its last occurrence, as PyTorch's CPU kernel; NaNs never equal each other."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    n = x.shape[dim]
    if n == 0:
        shape = x.shape[:dim] + ((1,) if keepdim else ()) + x.shape[dim + 1:]
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    values, indices = _sort(x, dim, False)
    prev = lax.slice_in_dim(values, 0, n - 1, axis=dim)
    nxt = lax.slice_in_dim(values, 1, n, axis=dim)
    first = jnp.ones_like(lax.slice_in_dim(values, 0, 1, axis=dim), jnp.bool_)
    starts = jnp.concatenate([first, nxt != prev], axis=dim)
    pos = _iota(x, dim)
    run_start = lax.cummax(jnp.where(starts, pos, 0), axis=dim)
    run_len = pos - run_start + 1
    # The run that first reaches the longest length ends there: its last (largest) index.
    best = jnp.argmax(run_len, axis=dim, keepdims=True)
    return _take(values, best, dim, keepdim), _take(indices, best, dim, keepdim)


def _cumulative_extreme(x, dim, larger: bool):
    """Running max/min with the index of the latest extreme; a NaN wins and stays."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    if x.shape[dim] == 0:
        return x, jnp.zeros(x.shape, jnp.int64)

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = bv >= av if larger else bv <= av
        if _is_float(x):
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & take_b)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    return lax.associative_scan(combine, (x, _iota(x, dim)), axis=dim)


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cumulative_extreme(x, dim, larger=True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cumulative_extreme(x, dim, larger=False)


# ------------------------------------------------------------------ searching
def _bound(boundaries, values, right, sorter=None):
    """PyTorch's CPU lower/upper bound loop, elementwise: the first position p in the row
    with not(b[p] >= v) failing (>, for `right`). Run for a fixed number of halvings, so it
    gives CPU's answer even for NaNs and unsorted rows."""
    n = boundaries.shape[-1]
    if n == 0:
        return jnp.zeros(values.shape, jnp.int64)
    if sorter is not None:
        require((sorter >= 0) & (sorter < n), RuntimeError,
                "torch.searchsorted(): sorter index out of range")
        sorter = jnp.clip(sorter, 0, n - 1)

    def at(i):
        if boundaries.ndim == 1:
            i = sorter[i] if sorter is not None else i
            return boundaries[i]
        if sorter is not None:
            i = jnp.take_along_axis(sorter, i, axis=-1)
        return jnp.take_along_axis(boundaries, i, axis=-1)

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + ((hi - lo) >> 1)
        b = at(jnp.minimum(mid, n - 1))
        go_right = ~(b > values) if right else ~(b >= values)
        active = lo < hi
        return (jnp.where(active & go_right, mid + 1, lo),
                jnp.where(active & ~go_right, mid, hi))

    lo = jnp.zeros(values.shape, jnp.int64)
    hi = jnp.full(values.shape, n, jnp.int64)
    lo, _ = lax.fori_loop(0, int(n).bit_length(), halve, (lo, hi))
    return lo


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar, promote="default",
       operands=("sorted_sequence", "self"))
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    return _bound(sorted_sequence, x, right, sorter)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar, promote="default",
       operands=("self", "boundaries"))
def bucketize(x, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:  # the CPU kernel's check (not in PyTorch's meta kernel)
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return _bound(boundaries, x, right)


# ------------------------------------------------------------------- counting
@lower(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """CPU's histc: range from min/max (the data's extrema when equal), bins by linear
    interpolation in the input dtype, the last bin closed on the right."""
    if not _is_float(x):
        return _int_histc(x, bins, min, max)
    lo = jnp.asarray(min, jnp.float64)
    hi = jnp.asarray(max, jnp.float64)
    if x.size:
        flat = x.reshape(-1)
        same = lo == hi
        lo = jnp.where(same, jnp.min(flat).astype(jnp.float64), lo)
        hi = jnp.where(same, jnp.max(flat).astype(jnp.float64), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    require(jnp.isfinite(lo) & jnp.isfinite(hi), RuntimeError,
            "torch.histc: range of [min, max] is not finite")
    require(lo < hi, RuntimeError, "torch.histc: max must be larger than min")
    lo, hi = lo.astype(x.dtype), hi.astype(x.dtype)
    inside = (x >= lo) & (x <= hi)
    pos = ((x - lo) * jnp.asarray(bins, x.dtype) / (hi - lo))
    pos = jnp.where(inside, pos, 0).astype(jnp.int64)
    pos = jnp.clip(jnp.where(pos == bins, bins - 1, pos), 0, bins - 1)
    counts = jnp.zeros((bins,), jnp.float32 if x.dtype.itemsize < 4 else x.dtype)
    return counts.at[pos.reshape(-1)].add(inside.reshape(-1).astype(counts.dtype))


def _int_histc(x, bins, min, max):
    """CUDA's histc of integers, which the CPU kernel refuses (scripts written for "cuda"
    count integer ids with it, as transformers' grouped-experts MoE does): int64 arithmetic,
    bin (x - min) * bins // (max - min), the data's extrema when min == max."""
    v = x.reshape(-1).astype(jnp.int64)
    lo, hi = jnp.asarray(min).astype(jnp.int64), jnp.asarray(max).astype(jnp.int64)
    if v.size:
        same = lo == hi
        lo, hi = jnp.where(same, jnp.min(v), lo), jnp.where(same, jnp.max(v), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    require(lo < hi, RuntimeError, "torch.histc: max must be larger than min")
    inside = (v >= lo) & (v <= hi)
    pos = jnp.minimum(jnp.where(inside, (v - lo) * bins // (hi - lo), 0), bins - 1)
    return jnp.zeros((bins,), x.dtype).at[pos].add(inside.astype(x.dtype))


@lower(aten.masked_scatter.default, promote="result", operands=("self", "source"))
def masked_scatter(x, mask, source, meta):
    """Fill the True positions of `mask` (in row-major order) with source's leading elements."""
    if mask.dtype != jnp.bool_:  # the CPU kernel's check (not in PyTorch's meta kernel)
        raise RuntimeError("masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{type_name(mask.dtype)}")
    shape = meta[0].shape
    x = jnp.broadcast_to(x, shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    taken = jnp.cumsum(mask, dtype=jnp.int64)
    count = taken[-1] if taken.size else jnp.int64(0)
    require(count <= source.size, RuntimeError,
            "masked_scatter: Number of elements of source < number of ones in mask")
    if source.size == 0:
        return x
    picked = source.reshape(-1)[jnp.clip(taken - 1, 0, source.size - 1)]
    return jnp.where(mask, picked, x.reshape(-1)).reshape(shape)


@lower(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    """The source's gradient: grad at mask's True positions, in order; zeros past them."""
    shape = jnp.broadcast_shapes(grad.shape, mask.shape)
    grad = jnp.broadcast_to(grad, shape).reshape(-1)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    n = int(np.prod(sizes))
    where = jnp.where(mask, jnp.cumsum(mask, dtype=jnp.int64) - 1, n)
    return jnp.zeros((n,), grad.dtype).at[where].set(grad, mode="drop").reshape(sizes)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if x.size == 0:
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    idx = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=1).astype(jnp.int64)

