"""Reductions: sum, mean, prod, max/min, argmax/argmin, var/std, any/all, norms."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ...storage import dtypes
from ..registry import lower
from ._ops import aten


def _axes(x, dim):
    """PyTorch's dim argument (None, int or list; [] means all) as a JAX axis tuple."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({d % max(x.ndim, 1) for d in dim})) if x.ndim else ()


def _acc_dtype(x, dtype):
    """The dtype a sum accumulates in: the requested one, int64 for integers and bools."""
    if dtype is not None:
        return dtypes.to_jax(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.int64
    return x.dtype


@lower(aten.sum.dim_IntList, aten.sum.default)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(x.astype(_acc_dtype(x, dtype)), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.mean.dim, aten.mean.default)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    return jnp.mean(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.prod.dim_int, aten.prod.default)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(x.astype(_acc_dtype(x, dtype)), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.max.default)
def max_(x):
    return jnp.max(x)


@lower(aten.min.default)
def min_(x):
    return jnp.min(x)


def _arg_reduce(x, dim, keepdim, largest):
    """Index of the first max/min along dim, NaN counting as the extreme (PyTorch's rule)."""
    if dim is None:
        flat = x.reshape(-1)
        idx = _arg_reduce(flat, 0, False, largest)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    fn = jnp.argmax if largest else jnp.argmin
    isnan = jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.floating) else None
    idx = fn(x, axis=dim, keepdims=keepdim)
    if isnan is not None:
        nan_idx = jnp.argmax(isnan, axis=dim, keepdims=keepdim)
        idx = jnp.where(jnp.any(isnan, axis=dim, keepdims=keepdim), nan_idx, idx)
    return idx.astype(jnp.int64)


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, True)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, False)


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    idx = _arg_reduce(x, dim, keepdim, True)
    values = jnp.max(x, axis=dim, keepdims=keepdim) if x.ndim else x
    return values, idx


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    idx = _arg_reduce(x, dim, keepdim, False)
    values = jnp.min(x, axis=dim, keepdims=keepdim) if x.ndim else x
    return values, idx


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    axes = _axes(x, dim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    ddof = 1 if correction is None else correction
    mean = jnp.mean(x, axis=axes, keepdims=True)
    dev = x - mean
    sq = jnp.real(dev * jnp.conj(dev)) if jnp.iscomplexobj(x) else dev * dev
    return jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - ddof, 0)


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(var(x, dim, correction=correction, keepdim=keepdim))


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return (var(x, dim, correction=correction, keepdim=keepdim),
            jnp.mean(x, axis=_axes(x, dim), keepdims=keepdim))


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.linalg_vector_norm.default)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    axes = _axes(x, dim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = x.astype(_acc_dtype(x, dtype))
    return jnp.cumsum(x, axis=dim) if x.ndim else x


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = x.astype(_acc_dtype(x, dtype))
    return jnp.cumprod(x, axis=dim) if x.ndim else x


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    axes = _axes(x, dim)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        x = x.astype(jnp.float32)
    m = jnp.max(x, axis=axes, keepdims=True)
    m = lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0))
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=jnp.int64)
