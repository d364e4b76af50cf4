"""Pooling: max (with indices), average and adaptive pooling over 1-3 spatial dims, with grads.

Every op works on the last `nd` axes of its input, so batched and unbatched
inputs share one code path. Window geometry is static (Python/numpy); values
are dense XLA ops: strided slices or gathers along one axis at a time,
`reduce_window`, reshapes and small 0/1 matrices for adaptive windows.
Indices are PyTorch's: the flat position of the maximum within its (D, H, W)
plane; ties keep the first maximum in window order, and a NaN wins (the last
NaN, as PyTorch's loop does). Max unpooling checks its indices on the device.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import checks
from ..checks import require
from ..registry import lower
from ._ops import aten
from .linalg import precision


def _upcast(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


def _expand(v, nd: int) -> tuple[int, ...]:
    """PyTorch's int[N] arguments: one value for every dim, or one per dim."""
    v = tuple(v)
    return v * nd if len(v) == 1 else v


def _params(nd, kernel_size, stride, padding, dilation=(1,)):
    kernel = _expand(kernel_size, nd)
    stride = _expand(stride, nd) if len(stride) else kernel
    return kernel, stride, _expand(padding, nd), _expand(dilation, nd)


def _out_size(n, k, s, p, d, ceil_mode) -> int:
    """PyTorch's pooling_output_shape: a last window must start inside input or left padding."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _iota(shape, axis):
    return lax.broadcasted_iota(jnp.int64, shape, axis)


def _plane_strides(sizes) -> list[int]:
    return [math.prod(sizes[i + 1:]) for i in range(len(sizes))]


# ------------------------------------------------------------------ max pool
# A maximum and its index are reduced as pairs under one total order: NaN above
# every number (the larger index among NaNs: PyTorch keeps the last NaN it
# meets), then the larger value, then the smaller index (PyTorch keeps the first
# maximum). The order makes the reduction separable, one axis at a time, so a
# k x k window costs 2k steps, not k^2. Padding carries the lowest value and an
# index past every real one, so it never wins.


def _beats(v, i, best_v, best_i):
    """Whether (v, i) comes before (best_v, best_i) in the max-pool order."""
    ahead = (v > best_v) | ((v == best_v) & (i < best_i))
    if not jnp.issubdtype(v.dtype, jnp.floating):
        return ahead
    nan, best_nan = jnp.isnan(v), jnp.isnan(best_v)
    return jnp.where(nan, ~best_nan | (i > best_i), ~best_nan & ahead)


def _keep_best(candidates):
    """The best (value, index) pair of each position over a sequence of candidates."""
    best_v = best_i = None
    for v, i in candidates:
        if best_v is None:
            best_v, best_i = v, i
            continue
        take = _beats(v, i, best_v, best_i)
        best_v, best_i = jnp.where(take, v, best_v), jnp.where(take, i, best_i)
    return best_v, best_i


def _index_type(shape, nd):
    """int32 indices while planes are small enough (half the memory traffic), else int64."""
    return jnp.int32 if math.prod(shape[len(shape) - nd:]) < np.iinfo(np.int32).max else \
        jnp.int64


def _plane_index(shape, nd):
    """Each element's flat position within its (D, H, W) plane."""
    lead = len(shape) - nd
    dtype = _index_type(shape, nd)
    index = jnp.zeros(shape, dtype)
    for d, stride in enumerate(_plane_strides(shape[lead:])):
        index = index + lax.broadcasted_iota(dtype, shape, lead + d) * stride
    return index


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _params(nd, kernel_size, stride, padding, dilation)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    outs = [_out_size(*g, ceil_mode) for g in zip(sizes, kernel, stride, padding, dilation)]
    if 0 in outs or 0 in x.shape:
        shape = x.shape[:lead] + tuple(outs)
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    value, index = x, _plane_index(x.shape, nd)
    lowest = jnp.asarray(_lowest(x.dtype), x.dtype)
    for d, (n, o, k, s, p, dil) in enumerate(zip(sizes, outs, kernel, stride, padding,
                                                 dilation)):
        axis = lead + d
        config = [(0, 0, 0)] * value.ndim
        config[axis] = (p, max(0, (o - 1) * s + dil * (k - 1) + 1 - n - p), 0)
        value = lax.pad(value, lowest, config)
        index = lax.pad(index, jnp.asarray(jnp.iinfo(index.dtype).max, index.dtype), config)
        taps = [(t * dil, t * dil + (o - 1) * s + 1) for t in range(k)]
        value, index = _keep_best(
            (lax.slice_in_dim(value, lo, hi, s, axis), lax.slice_in_dim(index, lo, hi, s, axis))
            for lo, hi in taps)
    return value, index.astype(jnp.int64)


def _max_pool_backward(grad, x, nd, kernel_size, stride, padding, dilation, indices):
    kernel, stride, padding, dilation = _params(nd, kernel_size, stride, padding, dilation)
    checks.expect_dtype(indices)
    if 0 in grad.shape or 0 in x.shape:
        return jnp.zeros(x.shape, grad.dtype)
    # -1 (a window of -inf alone, in the CPU's forward) adds nothing, on the CPU and CUDA;
    # any other index off the plane is read unchecked by the CPU's kernel: refused here
    plane = math.prod(x.shape[x.ndim - nd:])
    require((indices >= -1) & (indices < plane), RuntimeError,
                   f"max_pool{nd}d_with_indices_backward: index {{0}} is out of bounds for "
                   f"an input plane of {plane} elements", indices)
    if stride == kernel and all(d == 1 for d in dilation):
        return _tiled_backward(grad, x, nd, kernel, padding, indices)
    return _scatter_to_plane(grad, x, nd, indices)


def _tiled_backward(grad, x, nd, kernel, padding, indices):
    """Windows that tile the input (stride == kernel): every input element lies in at most
    one window, so its gradient is its window's, where the window's index names it."""
    lead = x.ndim - nd
    g, idx = _upcast(grad), indices
    for d, (k, p) in enumerate(zip(kernel, padding)):
        axis = lead + d
        g, idx = jnp.repeat(g, k, axis=axis), jnp.repeat(idx, k, axis=axis)
        # Repeated position r covers input position r - p.
        config = [(0, 0, 0)] * g.ndim
        config[axis] = (-p, x.shape[axis] + p - g.shape[axis], 0)
        g = lax.pad(g, jnp.zeros((), g.dtype), config)
        idx = lax.pad(idx, jnp.asarray(-1, idx.dtype), config)
    hit = idx == _plane_index(x.shape, nd).astype(idx.dtype)
    return jnp.where(hit, g, 0).astype(grad.dtype)


def _scatter_to_plane(grad, x, nd, indices):
    """grad_input[..., indices[..., o]] += grad[..., o] within each plane: one scatter-add."""
    lead = x.ndim - nd
    planes = math.prod(x.shape[:lead])
    plane = math.prod(x.shape[lead:])
    g = _upcast(grad).reshape(planes, -1)
    idx = indices.reshape(planes, -1)
    idx = jnp.where(idx < 0, plane, idx)  # dropped (XLA would wrap a negative index)
    rows = lax.broadcasted_iota(jnp.int64, idx.shape, 0)
    out = jnp.zeros((planes, plane), g.dtype).at[rows, idx].add(g, mode="drop")
    return out.reshape(x.shape).astype(grad.dtype)


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,),
                            ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,),
                            ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _max_pool_backward(grad, x, 2, kernel_size, stride, padding, dilation, indices)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _max_pool_backward(grad, x, 3, kernel_size, stride, padding, dilation, indices)


# ------------------------------------------------------------------ avg pool
def _avg_divisor(nd, sizes, outs, kernel, stride, padding, count_include_pad, divisor_override):
    """PyTorch's divide_factor per output position (numpy, broadcastable over the outputs)."""
    if divisor_override is not None:
        return np.asarray(divisor_override)
    total = np.ones((1,) * nd, np.int64)
    for i, (n, o, k, s, p) in enumerate(zip(sizes, outs, kernel, stride, padding)):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        if count_include_pad:
            count = end - start
        else:
            count = np.minimum(end, n) - np.maximum(start, 0)
        shape = [1] * nd
        shape[i] = o
        total = total * count.reshape(shape)
    return np.maximum(total, 1)  # an empty window sums to 0 and gives 0, as in PyTorch


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    kernel, stride, padding, _ = _params(nd, kernel_size, stride, padding)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    outs = [_out_size(n, k, s, p, 1, ceil_mode)
            for n, k, s, p in zip(sizes, kernel, stride, padding)]
    high = [(o - 1) * s + k - n - p for n, o, k, s, p in zip(sizes, outs, kernel, stride, padding)]
    xf = _upcast(x)
    zero = jnp.zeros((), xf.dtype)
    # Explicit padding (negative `high` drops input no window reaches), then valid windows.
    xp = lax.pad(xf, zero, [(0, 0, 0)] * lead + [(p, h, 0) for p, h in zip(padding, high)])
    total = lax.reduce_window(xp, zero, lax.add, (1,) * lead + kernel, (1,) * lead + stride,
                              "VALID")
    divisor = _avg_divisor(nd, sizes, outs, kernel, stride, padding, count_include_pad,
                           divisor_override)
    if jnp.issubdtype(x.dtype, jnp.integer):
        divisor = jnp.broadcast_to(jnp.asarray(divisor, total.dtype), total.shape)
        return lax.div(total, divisor)  # C++ integer division: truncation
    return (total / jnp.asarray(divisor, total.dtype)).astype(x.dtype)


def _avg_pool_backward(grad, x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    kernel, stride, padding, _ = _params(nd, kernel_size, stride, padding)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    outs = grad.shape[lead:]
    divisor = _avg_divisor(nd, sizes, outs, kernel, stride, padding, count_include_pad,
                           divisor_override)
    g = _upcast(grad)
    g = g / jnp.asarray(divisor, g.dtype)
    # Input h receives every output whose window [o*s - p, o*s - p + k) holds it: a
    # stride-1 window sum over the outputs spread s apart.
    config = [(0, 0, 0)] * lead
    for n, o, k, s, p in zip(sizes, outs, kernel, stride, padding):
        low = k - 1 - p
        config.append((low, n + k - 1 - ((o - 1) * s + 1) - low, s - 1))
    spread = lax.pad(g, jnp.zeros((), g.dtype), config)
    out = lax.reduce_window(spread, jnp.zeros((), g.dtype), lax.add, (1,) * lead + kernel,
                            (1,) * (lead + nd), "VALID")
    return out.astype(grad.dtype)


@lower(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, 2, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, 3, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


# ------------------------------------------------------------- adaptive pools
def _adaptive_bounds(n: int, o: int):
    """PyTorch's adaptive windows: [floor(i*n/o), ceil((i+1)*n/o)) for each output i."""
    i = np.arange(o)
    return (i * n) // o, -((-(i + 1) * n) // o)


def _adaptive_matrix(n: int, o: int) -> np.ndarray:
    """(o, n) 0/1 matrix: row i selects the inputs of window i."""
    start, end = _adaptive_bounds(n, o)
    j = np.arange(n)
    return ((j >= start[:, None]) & (j < end[:, None])).astype(np.float32)


def _window_sums(x, axis: int, o: int):
    """Sums of the adaptive windows of `x` along `axis`: a reshape when they tile it."""
    n = x.shape[axis]
    if o and n % o == 0:
        return jnp.sum(x.reshape(x.shape[:axis] + (o, n // o) + x.shape[axis + 1:]),
                       axis=axis + 1)
    m = jnp.asarray(_adaptive_matrix(n, o), x.dtype)
    y = jnp.tensordot(x, m, axes=([axis], [1]), precision=precision())
    return jnp.moveaxis(y, -1, axis)


def _spread_windows(g, axis: int, n: int):
    """The adjoint of `_window_sums`: each input gets the sum over the windows holding it."""
    o = g.shape[axis]
    if o and n % o == 0:
        return jnp.repeat(g, n // o, axis=axis)
    m = jnp.asarray(_adaptive_matrix(n, o), g.dtype)
    y = jnp.tensordot(g, m, axes=([axis], [0]), precision=precision())
    return jnp.moveaxis(y, -1, axis)


def _adaptive_counts(sizes, outs) -> np.ndarray:
    total = np.ones((1,) * len(sizes), np.int64)
    for i, (n, o) in enumerate(zip(sizes, outs)):
        start, end = _adaptive_bounds(n, o)
        shape = [1] * len(sizes)
        shape[i] = o
        total = total * (end - start).reshape(shape)
    return total


def _adaptive_avg_pool(x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    y = _upcast(x)
    for i, o in enumerate(output_size):
        y = _window_sums(y, lead + i, o)
    counts = _adaptive_counts(x.shape[lead:], output_size)
    return (y / jnp.asarray(counts, y.dtype)).astype(x.dtype)


def _adaptive_avg_pool_backward(grad, x, nd):
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    g = _upcast(grad)
    g = g / jnp.asarray(_adaptive_counts(sizes, grad.shape[lead:]), g.dtype)
    for i, n in enumerate(sizes):
        g = _spread_windows(g, lead + i, n)
    return g.astype(grad.dtype)


@lower(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    return _adaptive_avg_pool(x, output_size)


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_pool_backward(grad, x, 2)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_pool_backward(grad, x, 3)


def _adaptive_max_pool(x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    out_shape = x.shape[:lead] + tuple(output_size)
    if 0 in out_shape:
        return jnp.zeros(out_shape, x.dtype), jnp.zeros(out_shape, jnp.int64)
    value, index = x, _plane_index(x.shape, nd)
    for d, (n, o) in enumerate(zip(x.shape[lead:], output_size)):
        axis = lead + d
        start, end = _adaptive_bounds(n, o)
        # Tap j of window i reads min(start_i + j, end_i - 1): repeating a window's last
        # element changes neither its maximum nor the index PyTorch reports.
        taps = [jnp.asarray(np.minimum(start + j, end - 1))
                for j in range(int((end - start).max()))]
        value, index = _keep_best(
            (jnp.take(value, t, axis=axis), jnp.take(index, t, axis=axis)) for t in taps)
    return value, index.astype(jnp.int64)


@lower(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    return _adaptive_max_pool(x, output_size)


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_plane(grad, x, 2, indices)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_plane(grad, x, 3, indices)


# ------------------------------------------------------------------ unpooling
def _max_unpool(x, indices, output_size):
    """Each input element written at its index in the flat plane of its (N, C), zeros
    elsewhere; of elements sharing an index the last wins (the CPU's threads pick any). An
    index outside the plane raises the CPU's error (a device-side check)."""
    spatial = tuple(int(s) for s in output_size)
    plane = math.prod(spatial)
    nd = len(spatial)
    lead = x.shape[:-nd]
    rows = math.prod(lead)
    src = x.reshape(rows, -1)
    idx = indices.reshape(rows, -1).astype(jnp.int64)
    require((idx >= 0) & (idx < plane), RuntimeError, "Found an invalid max index: {0} "
            f"(output volumes are of size {'x'.join(map(str, spatial))})", idx)
    r = jnp.arange(rows)[:, None]
    position = jnp.broadcast_to(jnp.arange(src.shape[1]), src.shape)
    winner = jnp.full((rows, plane), -1, jnp.int64).at[r, idx].max(position, mode="drop")
    picked = jnp.take_along_axis(src, jnp.maximum(winner, 0), axis=1)
    out = jnp.where(winner >= 0, picked, jnp.zeros((), x.dtype))
    return out.reshape(lead + spatial)


@lower(aten.max_unpool2d.default)
def max_unpool2d(x, indices, output_size):
    return _max_unpool(x, indices, output_size)


@lower(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _max_unpool(x, indices, output_size)
