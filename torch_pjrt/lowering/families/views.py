"""View ops as functions of their input's values, for compiled graphs.

In eager mode views never reach a lowering (they are PyTorch metadata over the
same storage, served by the shim). In a functionalized FX graph from
torch.compile they are ordinary functions, lowered here; `as_strided` treats
its input as a dense row-major buffer, which is what functionalization gives.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ...storage import views as storage_views
from ...storage.dtypes import to_jax
from ..registry import lower
from ._ops import aten


def _dims(shape, x):
    """PyTorch's view sizes (with one -1) as a concrete shape."""
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.size // known if known else 0
    return tuple(shape)


@lower(aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
       aten.reshape.default, eager=False)
def view(x, size, *stride):
    return x.reshape(_dims(size, x))


@lower(aten.view.dtype, eager=False)
def view_dtype(x, dtype):
    target = to_jax(dtype)
    if target.itemsize == x.dtype.itemsize:
        return storage_views.reinterpret(x.reshape(-1), target).reshape(x.shape)
    flat = storage_views.reinterpret(x.reshape(-1), target)
    return flat.reshape(x.shape[:-1] + (-1,)) if x.ndim else flat


@lower(aten.alias.default, aten.detach.default, aten.lift_fresh.default, eager=False)
def alias(x):
    return x


# A graph's values are what the tensors read as, so the conjugate and negative views are
# their math: eager mode keeps them as the tensor's flags instead (eager/trace.py).
@lower(aten._conj.default, eager=False)
def conj_view(x):
    return jnp.conj(x)


@lower(aten._neg_view.default, eager=False)
def neg_view(x):
    return -x


@lower(aten.t.default, eager=False)
def t(x):
    return x.T if x.ndim == 2 else x


@lower(aten.transpose.int, eager=False)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1) if x.ndim else x


@lower(aten.permute.default, eager=False)
def permute(x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@lower(aten.expand.default, eager=False)
def expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lower(aten.unsqueeze.default, eager=False)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lower(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, eager=False)
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    drop = tuple(d % x.ndim for d in dims if x.shape[d % x.ndim] == 1)
    return jnp.squeeze(x, drop) if drop else x


@lower(aten.slice.Tensor, eager=False)
def slice_(x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, start), n)
    return lax.slice_in_dim(x, start, end, step, axis=dim % x.ndim)


@lower(aten.select.int, eager=False)
def select(x, dim, index):
    dim = dim % x.ndim
    index = index + x.shape[dim] if index < 0 else index
    return lax.index_in_dim(x, index, axis=dim, keepdims=False)


@lower(aten.split.Tensor, eager=False)
def split(x, split_size, dim=0):
    n = x.shape[dim]
    bounds = list(range(0, n, max(split_size, 1)))[1:] if n else []
    return jnp.split(x, bounds, axis=dim) if n else [x]


@lower(aten.split_with_sizes.default, eager=False)
def split_with_sizes(x, split_sizes, dim=0):
    bounds, acc = [], 0
    for s in split_sizes[:-1]:
        acc += s
        bounds.append(acc)
    return jnp.split(x, bounds, axis=dim)


@lower(aten.unbind.int, eager=False)
def unbind(x, dim=0):
    return [lax.index_in_dim(x, i, axis=dim % x.ndim, keepdims=False)
            for i in range(x.shape[dim])]


@lower(aten.diagonal.default, eager=False)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@lower(aten.as_strided.default, eager=False)
def as_strided(x, size, stride, storage_offset=None):
    return storage_views.read(x.reshape(-1), tuple(size), tuple(stride), storage_offset or 0)


@lower(aten.unfold.default, eager=False)
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    d = dimension % x.ndim
    n = (x.shape[d] - size) // step + 1
    idx = jnp.arange(n)[:, None] * step + jnp.arange(size)[None, :]
    taken = jnp.take(x, idx.reshape(-1), axis=d).reshape(x.shape[:d] + (n, size) + x.shape[d + 1:])
    return jnp.moveaxis(taken, d + 1, -1)


@lower(aten.view_as_real.default, eager=False)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lower(aten.view_as_complex.default, eager=False)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])
