"""Shape ops that move data: cat, padding, flips, scatters into slices, windows, *_copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..checks import index_dtype, index_nonnegative, require
from ..registry import lower
from ._ops import aten


@lower(aten.cat.default, promote="result")
def cat(tensors, dim=0):
    # PyTorch skips legacy empty 1-D tensors of shape (0,) when concatenating.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    return jnp.concatenate(kept, axis=dim % kept[0].ndim)


@lower(aten.stack.default, promote="result")
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim % (tensors[0].ndim + 1))


@lower(aten.constant_pad_nd.default, promote="result", operands=("self", "value"))
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    # Negative padding crops.
    lo = [max(-a, 0) for a, _ in widths]
    hi = [x.shape[d] - max(-b, 0) for d, (_, b) in enumerate(widths)]
    x = x[tuple(slice(a, b) for a, b in zip(lo, hi))]
    return jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], constant_values=value)


@lower(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims)) if x.ndim else x


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


# ------------------------------------------------------------- reflect, replicate
def _pad_mode(x, padding, mode):
    """jnp.pad over the last len(padding)//2 dims in PyTorch's (last dim first) order;
    negative widths crop after padding, so reflections are about the original edges."""
    widths = [(0, 0)] * x.ndim
    for i in range(len(padding) // 2):
        widths[x.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
    x = jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], mode=mode)
    return x[tuple(slice(max(-a, 0), n - max(-b, 0)) for (a, b), n in zip(widths, x.shape))]


def _pad_backward(grad, x, padding, mode):
    _, pullback = jax.vjp(lambda t: _pad_mode(t, padding, mode), jnp.zeros(x.shape, grad.dtype))
    return pullback(grad)[0]


def _check_pad_input(x, padding):
    """ATen's shape check of the reflection and replication pads: nD padding takes an
    (n+1)-d or (n+2)-d input, every dimension but the batch nonzero. PyTorch's meta kernels
    of the 2-d and 3-d pads do not check it: a 5-d input to reflection_pad2d reached the
    lowering and failed there with a broadcasting ValueError."""
    n = len(padding) // 2
    if x.ndim not in (n + 1, n + 2) or 0 in x.shape[x.ndim - n - 1:]:
        raise RuntimeError(
            f"Expected {n + 1}D or {n + 2}D (batch mode) tensor with possibly 0 batch size "
            f"and other non-zero dimensions for input, but got: {list(x.shape)}")


@lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
       aten.reflection_pad3d.default)
def reflection_pad(x, padding):
    _check_pad_input(x, padding)
    return _pad_mode(x, padding, "reflect")


@lower(aten.replication_pad1d.default, aten.replication_pad2d.default,
       aten.replication_pad3d.default)
def replication_pad(x, padding):
    _check_pad_input(x, padding)
    return _pad_mode(x, padding, "edge")


@lower(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
       aten.reflection_pad3d_backward.default)
def reflection_pad_backward(grad, x, padding):
    return _pad_backward(grad, x, padding, "reflect")


@lower(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
       aten.replication_pad3d_backward.default)
def replication_pad_backward(grad, x, padding):
    return _pad_backward(grad, x, padding, "edge")


# ------------------------------------------------------------ scatters and backwards
def _slice(n, start, end, step):
    return slice(*slice(start, end, step).indices(n))


def _on_diagonal(values, n1, n2, offset):
    """A (n1, n2) mask of the offset diagonal, and `values` (the diagonal's elements in
    order, last axis) broadcastable to (..., n1, n2) with each on its diagonal position."""
    mask = (np.arange(n2)[None, :] - np.arange(n1)[:, None]) == offset
    lead = [(0, 0)] * (values.ndim - 1)
    if offset >= 0:  # element i sits in row i
        return mask, jnp.pad(values, lead + [(0, n1 - values.shape[-1])])[..., :, None]
    return mask, jnp.pad(values, lead + [(0, n2 - values.shape[-1])])[..., None, :]


def _diagonal_scatter(x, src, offset, dim1, dim2):
    dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    mask, full = _on_diagonal(src.astype(x.dtype), x.shape[dim1], x.shape[dim2], offset)
    return jnp.moveaxis(jnp.where(mask, full, moved), (-2, -1), (dim1, dim2))


@lower(aten.diagonal_scatter.default, promote="result")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return _diagonal_scatter(x, src, offset, dim1, dim2)


@lower(aten.select_scatter.default, promote="result")
def select_scatter(x, src, dim, index):
    dim = dim % x.ndim
    if not -x.shape[dim] <= index < x.shape[dim]:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(x.shape)} at dimension {dim}")
    index = index + x.shape[dim] if index < 0 else index
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index, dim)


@lower(aten.slice_scatter.default, promote="result")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    where = _slice(x.shape[dim], start, end, step)
    if where.step == 1 and src.shape[dim]:
        return lax.dynamic_update_slice_in_dim(x, src.astype(x.dtype), where.start, dim)
    return x.at[(slice(None),) * dim + (where,)].set(src)


@lower(aten.diagonal_backward.default)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    return _diagonal_scatter(jnp.zeros(input_sizes, grad.dtype), grad, offset, dim1, dim2)


@lower(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    return select_scatter(jnp.zeros(input_sizes, grad.dtype), grad, dim, index)


@lower(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(input_sizes, grad.dtype), grad, dim, start, end, step)


@lower(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    n = x.shape[-1] + abs(offset)
    mask, full = _on_diagonal(x, n, n, offset)
    out = jnp.where(mask, full, jnp.zeros((), x.dtype))
    out = jnp.broadcast_to(out, x.shape[:-1] + (n, n))
    ndim = x.ndim + 1
    return jnp.moveaxis(out, (-2, -1), (dim1 % ndim, dim2 % ndim))


@lower(aten.index_reduce.default, promote="result", operands=("self", "source"))
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """x's slices along dim at `index` reduced with source's (prod, mean, amax, amin)."""
    index_dtype(index, (jnp.int32, jnp.int64), RuntimeError,
                "index_reduce_(): Expected dtype int32/int64 for index but got: {0}")
    shape = x.shape
    if x.ndim == 0:
        x, source = x.reshape(1), source.reshape(1)
    dim = dim % x.ndim
    xm, sm = jnp.moveaxis(x, dim, 0), jnp.moveaxis(source, dim, 0)
    # no negative index, none past the end (the CPU's check; XLA would drop them silently)
    index = index_nonnegative(index.reshape(-1).astype(jnp.int64), xm.shape[0], IndexError,
                              "index out of range in self")
    counts = jnp.zeros((xm.shape[0],), jnp.int64).at[index].add(1)
    touched = (counts > 0).reshape((-1,) + (1,) * (xm.ndim - 1))
    if reduce == "mean":
        total = jnp.where(touched & (not include_self), 0, xm).at[index].add(sm)
        n = (counts + (1 if include_self else 0)).reshape(touched.shape)
        if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
            mean = total / jnp.maximum(n, 1).astype(x.dtype)
        else:
            mean = jnp.floor_divide(total, jnp.maximum(n, 1).astype(x.dtype))
        out = jnp.where(touched, mean, xm)
    else:
        if not include_self:
            if jnp.issubdtype(x.dtype, jnp.floating):
                ident = {"prod": 1, "amax": -jnp.inf, "amin": jnp.inf}[reduce]
            elif x.dtype == jnp.bool_:
                ident = {"prod": True, "amax": False, "amin": True}[reduce]
            else:
                info = jnp.iinfo(x.dtype)
                ident = {"prod": 1, "amax": info.min, "amin": info.max}[reduce]
            xm = jnp.where(touched, jnp.asarray(ident, x.dtype), xm)
        ref = xm.at[index]
        out = {"prod": ref.multiply, "amax": ref.max, "amin": ref.min}[reduce](sm)
    return jnp.moveaxis(out, 0, dim).reshape(shape)


@lower(aten.take.default)
def take(x, index):
    n = x.size
    require((index >= -n) & (index < n), IndexError,
            f"take(): index out of range for a tensor of {n} elements")
    if n == 0:
        return jnp.zeros(index.shape, x.dtype)
    return x.reshape(-1)[jnp.where(index < 0, index + n, index)]


@lower(aten.rot90.default)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=tuple(d % x.ndim for d in dims))


@lower(aten.block_diag.default, promote="result")
def block_diag(tensors):
    blocks = [t.reshape((1,) * (2 - t.ndim) + t.shape) if t.ndim < 2 else t for t in tensors]
    cols = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        rows.append(jnp.pad(b, ((0, 0), (left, cols - left - b.shape[1]))))
        left += b.shape[1]
    return jnp.concatenate(rows, axis=0)


@lower(aten._chunk_cat.default, promote="result")
def chunk_cat(tensors, dim, num_chunks):
    """Each tensor split in num_chunks along dim (zero-padded to a multiple), flattened
    from dim on, and the chunks concatenated chunk by chunk."""
    dim = dim % tensors[0].ndim if all(t.ndim == tensors[0].ndim for t in tensors) else dim
    parts = []
    for t in tensors:
        size = t.shape[dim]
        padded = -(-size // num_chunks) * num_chunks
        if padded != size:
            widths = [(0, 0)] * t.ndim
            widths[dim] = (0, padded - size)
            t = jnp.pad(t, widths)
        parts.append(t.reshape(t.shape[:dim] + (num_chunks, -1)))
    return jnp.concatenate(parts, axis=dim + 1)


# ------------------------------------------------------------- windows and blocks
def _windows(n, size, step):
    """(count, size) positions of the windows unfold takes along a dim of length n."""
    count = (n - size) // step + 1
    return np.arange(count)[:, None] * step + np.arange(size)[None, :]


@lower(aten.unfold_copy.default)
def unfold_copy(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    dim = dimension % x.ndim
    taken = jnp.take(x, jnp.asarray(_windows(x.shape[dim], size, step)), axis=dim)
    return jnp.moveaxis(taken, dim + 1, -1)


@lower(aten.unfold_backward.default)
def unfold_backward(grad, input_sizes, dim, size, step):
    if len(input_sizes) == 0:
        return grad.reshape(())
    dim = dim % len(input_sizes)
    idx = _windows(input_sizes[dim], size, step)
    g = jnp.moveaxis(grad, -1, dim + 1)  # (..., count, size, ...)
    g = g.reshape(g.shape[:dim] + (-1,) + g.shape[dim + 2:])
    out = jnp.zeros(tuple(input_sizes), grad.dtype)
    where = (slice(None),) * dim + (jnp.asarray(idx.reshape(-1)),)
    return out.at[where].add(g)


def _block_starts(n, kernel, dilation, padding, stride):
    count = (n + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return count, [k * dilation for k in range(kernel)]


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    x = x if batched else x[None]
    n, c, h, w = x.shape
    x = jnp.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    oh, rows = _block_starts(h, kernel_size[0], dilation[0], padding[0], stride[0])
    ow, cols = _block_starts(w, kernel_size[1], dilation[1], padding[1], stride[1])
    patches = [x[:, :, r:r + stride[0] * (oh - 1) + 1:stride[0],
                 q:q + stride[1] * (ow - 1) + 1:stride[1]] for r in rows for q in cols]
    out = jnp.stack(patches, axis=2).reshape(n, c * len(patches), oh * ow)
    return out if batched else out[0]


@lower(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    """im2col's transpose: each kernel position's blocks spread back (a strided pad) and
    summed; dense pads and adds rather than a scatter."""
    batched = x.ndim == 3
    x = x if batched else x[None]
    h, w = output_size
    kh, kw = kernel_size
    hp, wp = h + 2 * padding[0], w + 2 * padding[1]
    oh, rows = _block_starts(h, kh, dilation[0], padding[0], stride[0])
    ow, cols = _block_starts(w, kw, dilation[1], padding[1], stride[1])
    n, c = x.shape[0], x.shape[1] // (kh * kw)
    blocks = x.reshape(n, c, kh * kw, oh, ow)
    zero = jnp.zeros((), x.dtype)
    out = jnp.zeros((n, c, hp, wp), x.dtype)
    for i, r in enumerate(rows):
        for j, q in enumerate(cols):
            span_h, span_w = stride[0] * (oh - 1) + 1, stride[1] * (ow - 1) + 1
            out = out + lax.pad(blocks[:, :, i * kw + j], zero, [
                (0, 0, 0), (0, 0, 0), (r, hp - r - span_h, stride[0] - 1),
                (q, wp - q - span_w, stride[1] - 1)])
    out = out[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
    return out if batched else out[0]


@lower(aten.pixel_shuffle.default)
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    x = jnp.transpose(x, (*range(k), k, k + 3, k + 1, k + 4, k + 2))
    return x.reshape(*lead, c // (r * r), h * r, w * r)


@lower(aten.pixel_unshuffle.default)
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(*lead, c, h // r, r, w // r, r)
    k = len(lead)
    x = jnp.transpose(x, (*range(k), k, k + 2, k + 4, k + 1, k + 3))
    return x.reshape(*lead, c * r * r, h // r, w // r)


@lower(aten.channel_shuffle.default)
def channel_shuffle(x, groups):
    n, c = x.shape[:2]
    rest = x.shape[2:]
    x = x.reshape(n, groups, c // groups, *rest)
    return jnp.swapaxes(x, 1, 2).reshape(n, c, *rest)


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None,
                 pin_memory=None):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)).reshape(2, -1), jnp.int64)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None,
                 pin_memory=None):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)).reshape(2, -1), jnp.int64)


# ------------------------------------------------- *_copy: view ops that copy
@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    dim = dim % x.ndim
    start = start + x.shape[dim] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lower(aten.slice_copy.Tensor)
def slice_copy(x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    return x[(slice(None),) * dim + (_slice(x.shape[dim], start, end, step),)]


@lower(aten.select_copy.int)
def select_copy(x, dim, index):
    dim = dim % x.ndim
    return x[(slice(None),) * dim + (index + x.shape[dim] if index < 0 else index,)]


@lower(aten.diagonal_copy.default)
def diagonal_copy(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@lower(aten.permute_copy.default)
def permute_copy(x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@lower(aten.transpose_copy.int)
def transpose_copy(x, dim0, dim1):
    return jnp.swapaxes(x, dim0 % x.ndim, dim1 % x.ndim) if x.ndim else x


@lower(aten.t_copy.default)
def t_copy(x):
    return x.T


@lower(aten.expand_copy.default, aten.view_copy.default, aten.unsqueeze_copy.default,
       aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
       aten.alias_copy.default, aten.detach_copy.default)
def reshape_copy(x, *args, meta, **kwargs):
    """Copies of views that only reshape or broadcast: the shape comes from PyTorch."""
    shape = meta[0].shape
    return jnp.broadcast_to(x, shape) if x.size != np.prod(shape) else x.reshape(shape)


@lower(aten.unbind_copy.int)
def unbind_copy(x, dim=0):
    dim = dim % x.ndim
    return [jnp.take(x, i, axis=dim) for i in range(x.shape[dim])]


@lower(aten.split_with_sizes_copy.default, aten.split_copy.Tensor)
def split_copy(x, split_size, dim=0, *, meta):
    """Pieces of x along dim; their sizes are the ones PyTorch's meta kernel gave."""
    dim = dim % x.ndim
    bounds = np.cumsum([0] + [m.shape[dim] for m in meta])
    return [lax.slice_in_dim(x, int(a), int(b), axis=dim) for a, b in zip(bounds, bounds[1:])]


@lower(aten.put.default, promote="result", operands=("self", "source"))
def put(x, index, source, accumulate=False):
    """take's inverse: source written (or added) at flat positions of x."""
    index_dtype(index, (jnp.int64,), RuntimeError,
                "put_(): Expected a long tensor for index, but got {0}")
    n = x.size
    require((index >= -n) & (index < n), IndexError,
            f"put_(): index out of range for a tensor of {n} elements")
    if n == 0:
        return x
    flat = jnp.where(index < 0, index + n, index).reshape(-1)
    ref = x.reshape(-1).at[flat]
    src = source.reshape(-1)
    return (ref.add(src) if accumulate else ref.set(src)).reshape(x.shape)
