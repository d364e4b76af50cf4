"""Reading and writing a strided view of a flat storage buffer, as traced JAX code.

A pjrt storage is one flat XLA buffer; a tensor is (shape, stride, offset, dtype)
over it, exactly as PyTorch describes it. These functions run inside the jitted
program of an op, where the view metadata is static, so XLA sees plain slices,
reshapes and transposes (a gather or scatter only for overlapping views).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

Shape = tuple[int, ...]


def contiguous_strides(shape: Sequence[int]) -> Shape:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


# ------------------------------------------------------------ reinterpretation
def _to_bytes(x):
    """A flat array as its raw bytes (uint8), for dtype reinterpretation."""
    if x.dtype == jnp.uint8:
        return x
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        part = jnp.float32 if x.dtype == jnp.complex64 else jnp.float64
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).astype(part).reshape(-1)
    return lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _from_bytes(b, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.uint8:
        return b
    if dtype == np.bool_:
        return b != 0
    if np.issubdtype(dtype, np.complexfloating):
        part = np.float32 if dtype == np.complex64 else np.float64
        f = _from_bytes(b, part).reshape(-1, 2)
        return lax.complex(f[:, 0], f[:, 1])
    size = dtype.itemsize
    usable = (b.shape[0] // size) * size
    if usable != b.shape[0]:
        b = b[:usable]
    if size == 1:
        return lax.bitcast_convert_type(b, dtype)
    return lax.bitcast_convert_type(b.reshape(-1, size), dtype)


def reinterpret(flat, dtype):
    """The bytes of `flat` read as `dtype` (PyTorch's Tensor.view(dtype))."""
    dtype = np.dtype(dtype)
    if flat.dtype == dtype:
        return flat
    src = np.dtype(flat.dtype)
    simple = (np.bool_, np.complex64, np.complex128)
    if src.itemsize == dtype.itemsize and src.type not in simple and dtype.type not in simple:
        return lax.bitcast_convert_type(flat, dtype)
    return _from_bytes(_to_bytes(flat), dtype)


# ------------------------------------------------------- complex32 as float16 parts
def complex32_parts(shape: Shape, stride: Shape, offset):
    """The float16 view of a complex32 view's (real, imaginary) parts: one more dim of 2,
    every stride and the offset (static or traced) in float16 elements
    (storage/dtypes.py: COMPLEX32_PARTS)."""
    return (*shape, 2), (*(2 * s for s in stride), 1), offset * 2


def from_parts(parts):
    """complex32 values, read as float16 parts [..., 2], as the complex64 a program
    computes with."""
    return lax.complex(parts[..., 0].astype(jnp.float32), parts[..., 1].astype(jnp.float32))


def to_parts(value):
    """complex values as complex32 stores them: each part rounded to float16, [..., 2]."""
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.complexfloating):
        value = value.astype(jnp.complex64)
    return jnp.stack([jnp.real(value), jnp.imag(value)], axis=-1).astype(jnp.float16)


def round_to_complex32(value):
    """complex64 values as a complex32 tensor holds them (each part rounded to float16)."""
    return from_parts(to_parts(value))


# ---------------------------------------------------------------- view plans
def _block_plan(shape, stride):
    """Express a strided view as prefix-slices of a reshaped flat block.

    Returns (order, block_dims) or None. `order` lists the view's real dims by
    decreasing stride; the view is block.reshape(block_dims)[:, :n1, ..., :nk, :1]
    transposed back. Works when each stride divides the next larger one and
    dims do not overlap; otherwise the caller uses a gather or scatter.
    """
    order = [i for i in range(len(shape)) if shape[i] != 1 and stride[i] != 0]
    if any(stride[i] < 0 for i in order):
        return None
    order.sort(key=lambda i: -stride[i])
    for a, b in zip(order, order[1:]):
        if stride[b] == 0 or stride[a] % stride[b] or stride[a] < stride[b] * shape[b]:
            return None
    if not order:
        return order, ()
    s = [stride[i] for i in order]
    block = [shape[order[0]]] + [s[j - 1] // s[j] for j in range(1, len(s))] + [s[-1]]
    return order, tuple(block)


def _segment(flat, offset, length):
    """flat[offset:offset+length], zero-padded where it runs past the end."""
    end = offset + length
    if end > flat.shape[0]:
        flat = jnp.pad(flat, (0, end - flat.shape[0]))
    return lax.slice(flat, (offset,), (end,))


def _aligned_start(offset: int, block: Shape, limits: Shape) -> tuple[int, Shape] | None:
    """Where to cut the block that holds a view: (base, start), a base at a whole row of
    the block's first dim and the view's start inside the block from there; None when the
    offset's coordinates leave no room for the view. Views at an offset into a larger
    buffer (q, k and v of one qkv projection) read and write in place this way, where a
    block cut at the offset itself would run past the buffer's end (a padded copy)."""
    strides = [math.prod(block[j + 1:]) for j in range(len(block))]
    coords = [(offset // strides[j]) % block[j] for j in range(1, len(block))]
    if any(c + n > b for c, n, b in zip(coords, limits[1:], block[1:])):
        return None
    return offset - sum(c * st for c, st in zip(coords, strides[1:])), (0, *coords)


def _block_start(flat, offset: int, block: Shape, limits: Shape) -> tuple[int, Shape]:
    if offset + math.prod(block) > flat.shape[0]:
        aligned = _aligned_start(offset, block, limits)
        if aligned is not None:
            return aligned
    return offset, (0,) * len(block)


def _indices(shape, stride, offset):
    idx = jnp.full(shape, offset, dtype=jnp.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        if n != 1 and s != 0:
            idx = idx + lax.broadcasted_iota(jnp.int64, shape, d) * s
    return idx


def _block_limits(shape: Shape, order, block: Shape) -> Shape:
    """The extent of a view inside its block: the view's dims in block order, then the
    trailing element dim."""
    return (block[0],) + tuple(shape[i] for i in order[1:]) + (1,)


def read(flat, shape: Shape, stride: Shape, offset: int, dtype=None):
    """The tensor (shape, stride, offset) of a flat buffer, as a dense array."""
    if dtype is not None:
        flat = reinterpret(flat, dtype)
    numel = math.prod(shape)
    if numel == 0:
        return jnp.zeros(shape, flat.dtype)
    if is_contiguous(shape, stride):
        if offset == 0 and numel == flat.shape[0]:
            return flat.reshape(shape)
        return _segment(flat, offset, numel).reshape(shape)
    plan = _block_plan(shape, stride)
    if plan is None:
        return flat.at[_indices(shape, stride, offset)].get(mode="promise_in_bounds")
    order, block = plan
    if not order:  # one element, broadcast
        return jnp.broadcast_to(_segment(flat, offset, 1).reshape((1,) * len(shape)), shape)
    limits = _block_limits(shape, order, block)
    base, start = _block_start(flat, offset, block, limits)
    seg = _segment(flat, base, math.prod(block)).reshape(block)
    dense = lax.slice(seg, start, tuple(c + n for c, n in zip(start, limits)))
    dense = dense.reshape([shape[i] for i in order])
    # dense has the real dims in `order`; put them back in view order, then
    # restore size-1 dims and broadcast stride-0 dims.
    real = sorted(order)
    dense = jnp.transpose(dense, [order.index(i) for i in real])
    kept = [shape[i] if i in real else 1 for i in range(len(shape))]
    return jnp.broadcast_to(dense.reshape(kept), shape)


def span(shape: Shape, stride: Shape) -> int:
    """Elements of a buffer a view (shape, stride) covers from its offset to its last
    element, both included: 0 for an empty view."""
    if not all(shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def read_at(flat, shape: Shape, stride: Shape, offset, dtype=None):
    """A non-empty view at a run-time `offset` (a traced integer): one program serves the
    view at every offset that keeps it inside the buffer, as all of PyTorch's do
    (call_key.dynamic_offset). A strided view reads the span of the buffer it covers from
    `offset`, then itself at offset 0 of that span."""
    if dtype is not None:
        flat = reinterpret(flat, dtype)
    if is_contiguous(shape, stride):
        return lax.dynamic_slice(flat, (offset,), (math.prod(shape),)).reshape(shape)
    return read(lax.dynamic_slice(flat, (offset,), (span(shape, stride),)), shape, stride, 0)


def _differs(a, b):
    """Elementwise a != b, where NaN equals NaN (a NaN left in place is not a write)."""
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return (a != b) & ~(jnp.isnan(a) & jnp.isnan(b))
    return a != b


def _collapse_aliased(flat, value, shape, stride, offset):
    """A value for a view with stride-0 dims (an expanded tensor: each location appears
    many times) reduced to one copy per location. The copy kept is the last, in row-major
    order, that differs from what the location holds: PyTorch refuses most writes into
    expanded tensors, and those it allows (index_put_, index_fill_, index_copy_, with a
    deprecation warning) write only the indexed elements, one after another, so the last
    written wins. (value, shape) with the stride-0 dims of size 1."""
    aliased = [d for d, (n, s) in enumerate(zip(shape, stride)) if s == 0 and n != 1]
    kept = [d for d in range(len(shape)) if d not in aliased]
    old = read(flat, shape, stride, offset)
    perm = aliased + kept
    k = math.prod(shape[d] for d in aliased)
    rest = [shape[d] for d in kept]
    vals = jnp.transpose(value, perm).reshape([k, *rest])
    changed = _differs(vals, jnp.transpose(old, perm).reshape([k, *rest]))
    position = lax.broadcasted_iota(jnp.int32, vals.shape, 0)
    pick = jnp.max(jnp.where(changed, position, 0), axis=0, keepdims=True)
    vals = jnp.take_along_axis(vals, pick, axis=0)  # [1, *rest]
    shape = tuple(1 if d in aliased else n for d, n in enumerate(shape))
    inverse = [perm.index(d) for d in range(len(shape))]
    one = [1] * len(aliased)
    return jnp.transpose(vals.reshape(one + rest), inverse), shape


def write(flat, value, shape: Shape, stride: Shape, offset: int):
    """`flat` with the view (shape, stride, offset) replaced by `value`.

    `value` must already have the view's shape; its dtype decides the dtype of
    the returned buffer (the storage is reinterpreted when they differ).
    """
    flat = reinterpret(flat, value.dtype)
    numel = math.prod(shape)
    if numel == 0:
        return flat
    if is_contiguous(shape, stride):
        if offset == 0 and numel == flat.shape[0]:
            return value.reshape(-1)
        return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
    if any(s == 0 and n != 1 for n, s in zip(shape, stride)):
        value, shape = _collapse_aliased(flat, value, shape, stride, offset)
    plan = _block_plan(shape, stride)
    if plan is None:
        return flat.at[_indices(shape, stride, offset).reshape(-1)].set(value.reshape(-1))
    order, block = plan
    if not order:
        return lax.dynamic_update_slice(flat, value.reshape(-1)[:1], (offset,))
    length = math.prod(block)
    limits = _block_limits(shape, order, block)
    dense = jnp.transpose(value.reshape([shape[i] for i in sorted(order)]),
                          [sorted(order).index(i) for i in order])
    dense = dense.reshape(limits)
    base, start = _block_start(flat, offset, block, limits)
    end = base + length
    padded = jnp.pad(flat, (0, end - flat.shape[0])) if end > flat.shape[0] else flat
    seg = lax.slice(padded, (base,), (end,)).reshape(block)
    seg = lax.dynamic_update_slice(seg, dense, start)
    padded = lax.dynamic_update_slice(padded, seg.reshape(-1), (base,))
    return padded[: flat.shape[0]] if end > flat.shape[0] else padded


def write_at(flat, value, shape: Shape, stride: Shape, offset):
    """write() of a view at a run-time `offset` (a traced integer; call_key.dynamic_offset):
    the span of the buffer the view covers from `offset` is read, written at offset 0 and
    put back."""
    flat = reinterpret(flat, value.dtype)
    if is_contiguous(shape, stride):
        return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
    seg = write(lax.dynamic_slice(flat, (offset,), (span(shape, stride),)), value, shape,
                stride, 0)
    return lax.dynamic_update_slice(flat, seg, (offset,))


def to_flat(value, stride: Shape):
    """A dense result laid out in memory with the given (dense) strides."""
    shape = value.shape
    if is_contiguous(shape, stride):
        return value.reshape(-1)
    order = sorted(range(len(shape)), key=lambda i: (-stride[i], -i))
    return jnp.transpose(value, order).reshape(-1)
