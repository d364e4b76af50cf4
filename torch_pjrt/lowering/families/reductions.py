"""Reductions and scans: sum, mean, prod, max/min, argmax/argmin, var/std, any/all,
norms, logsumexp, cumsum/cumprod/logcumsumexp (cummax/cummin live in sorting).

PyTorch's rules kept here: integer and bool sums accumulate in int64; float16 and
bfloat16 accumulate in float32; max/min/amax/amin propagate NaN and argmax/argmin
point at the first NaN; an empty sum is 0, an empty logsumexp is -inf.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from ...storage import dtypes
from ..checks import cpp_type_name, type_name
from ..registry import lower
from ._ops import aten, is_complex, is_int

_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def _axes(x, dim):
    """PyTorch's dim argument (None, int or list; [] means all) as a JAX axis tuple."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({d % max(x.ndim, 1) for d in dim})) if x.ndim else ()


def _count(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _acc_dtype(x, dtype):
    """The dtype a sum accumulates in: the requested one, int64 for integers and bools,
    float32 for float16/bfloat16."""
    if dtype is not None:
        x_dtype = dtypes.to_jax(dtype)
    else:
        x_dtype = jnp.int64 if is_int(x) else x.dtype
    return jnp.float32 if x_dtype in _LOW_PRECISION else x_dtype


def _sum(x, axes, keepdim, dtype=None):
    return jnp.sum(x.astype(_acc_dtype(x, dtype)), axis=axes, keepdims=keepdim)


@lower(aten.sum.dim_IntList, aten.sum.default)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return _sum(x, _axes(x, dim), keepdim, dtype)


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    if isinstance(dim, (list, tuple)) and not dim and x.ndim:
        # PyTorch's CPU and CUDA kernels reduce every dimension, its meta kernel (whose
        # shape pjrt's output takes) none: the broadcast total was a wrong result
        raise RuntimeError(
            f"nansum(): dim=[] on a {x.ndim}-d pjrt tensor: PyTorch's CPU kernel reduces "
            "every dimension but its meta kernel keeps the input's shape, which pjrt's "
            "output takes; pass dim=None to reduce every dimension")
    if not is_int(x):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return _sum(x, _axes(x, dim), keepdim, dtype)


def _mean(x, axes, keepdim, dtype=None):
    total = _sum(x, axes, keepdim, dtype)
    return total / _count(x, axes) if _count(x, axes) else total * jnp.nan


@lower(aten.mean.dim, aten.mean.default)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    return _mean(x, _axes(x, dim), keepdim, dtype)


@lower(aten.prod.dim_int, aten.prod.default)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(x.astype(_acc_dtype(x, dtype)), axis=_axes(x, dim), keepdims=keepdim)


# ------------------------------------------------------------------ max / min
def _no_identity(x, op: str) -> None:
    if x.size == 0:
        raise RuntimeError(f"{op}(): Expected reduction dim to be specified for "
                           "input.numel() == 0. Specify the reduction dim with the 'dim' "
                           "argument.")


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)  # NaN propagates


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.max.default)
def max_(x):
    _no_identity(x, "max")
    return jnp.max(x)


@lower(aten.min.default)
def min_(x):
    _no_identity(x, "min")
    return jnp.min(x)


@lower(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False, meta=None):
    for out in meta or ():  # with out=: the CPU kernel wants out tensors of x's dtype
        if out.dtype != x.dtype:
            raise RuntimeError(f"Expected out tensor to have dtype {cpp_type_name(x.dtype)}, but "
                               f"got {cpp_type_name(out.dtype)} instead")
    if dim is None:
        _no_identity(x, "aminmax")
        axes = tuple(range(x.ndim))
    else:
        axes = _axes(x, dim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


@lower(aten._aminmax.default)
def aminmax_all(x):
    return aminmax(x)


@lower(aten._aminmax.dim)
def aminmax_dim(x, dim, keepdim=False):
    return aminmax(x, dim=dim, keepdim=keepdim)


def _arg_reduce(x, dim, keepdim, largest):
    """Index of the first max/min along dim, NaN counting as the extreme (PyTorch's rule)."""
    if dim is None:
        idx = _arg_reduce(x.reshape(-1), 0, False, largest)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    fn = jnp.argmax if largest else jnp.argmin
    idx = fn(x, axis=dim, keepdims=keepdim)
    if jnp.issubdtype(x.dtype, jnp.floating):
        isnan = jnp.isnan(x)
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


# ------------------------------------------------------------------ moments
def _var(x, axes, correction, keepdim):
    n = _count(x, axes)
    ddof = 1 if correction is None else correction
    if x.dtype in _LOW_PRECISION:
        x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=axes, keepdims=True) if n else jnp.full((1,) * x.ndim, jnp.nan,
                                                                       x.dtype)
    dev = x - mean
    sq = jnp.real(dev * jnp.conj(dev)) if is_complex(x) else dev * dev
    return jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - ddof, 0)


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, _axes(x, dim), correction, keepdim)


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, _axes(x, dim), correction, keepdim))


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    axes = _axes(x, dim)
    return _var(x, axes, correction, keepdim), _mean(x, axes, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    axes = _axes(x, dim)
    return jnp.sqrt(_var(x, axes, correction, keepdim)), _mean(x, axes, keepdim)


# ------------------------------------------------------------------ logical
@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=jnp.int64)


# ------------------------------------------------------------------ norms
@lower(aten.linalg_vector_norm.default, static=("ord",))
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    elif x.dtype in _LOW_PRECISION:
        x = x.astype(jnp.float32)
    axes = _axes(x, dim)
    a = jnp.abs(x)
    if ord == math.inf:
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    axes = _axes(x, dim)
    if is_int(x):
        x = x.astype(jnp.float32)
    elif x.dtype in _LOW_PRECISION:
        x = x.astype(jnp.float32)
    if _count(x, axes) == 0:
        shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape))
        out = jnp.full(shape, -jnp.inf, x.dtype)
        return out if keepdim else jnp.squeeze(out, axes)
    # The shift is the real max (for complex too), set to 0 where infinite.
    m = jnp.max(jnp.real(x), axis=axes, keepdims=True)
    m = lax.stop_gradient(jnp.where(jnp.isinf(m), 0, m)).astype(x.dtype)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


# ------------------------------------------------------------------ scans
def _scan_input(x, dim, dtype):
    return x.astype(_acc_dtype(x, dtype)), (dim % x.ndim if x.ndim else 0)


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x, axis = _scan_input(x, dim, dtype)
    return jnp.cumsum(x, axis=axis) if x.ndim else x


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x, axis = _scan_input(x, dim, dtype)
    return jnp.cumprod(x, axis=axis) if x.ndim else x


def _log_add_exp(a, b):
    """PyTorch's logcumsumexp step: equal infinities pass through; NaN propagates."""
    if is_complex(a):
        take_a = a.real >= b.real
        big, small = jnp.where(take_a, a, b), jnp.where(take_a, b, a)
        same_inf = jnp.isinf(big.real) & (big.real == small.real)
        return jnp.where(same_inf, big, big + jnp.log1p(jnp.exp(small - big)))
    lo, hi = jnp.minimum(a, b), jnp.maximum(a, b)
    return jnp.where((lo != hi) | jnp.isfinite(lo), hi + jnp.log1p(jnp.exp(lo - hi)), a)


def _logcumsumexp_meta(x, dim):
    torch._prims_common.canonicalize_dim(x.ndim, dim)  # IndexError, as the CPU kernel
    return torch.empty_like(x)


def _logcumsumexp_out_meta(x, dim, *, out):
    """The CPU kernel's checks and resize_output (torch.logcumsumexp(..., out=) calls it)."""
    torch._prims_common.canonicalize_dim(x.ndim, dim)
    if out.dtype != x.dtype:
        raise RuntimeError(f"expected scalar_type {type_name(x.dtype)} but found "
                           f"{type_name(out.dtype)}")
    torch._refs._maybe_resize_out(out, x.shape)
    return out


def _register_missing_meta() -> None:
    """PyTorch has no meta kernel for _logcumsumexp, nor its out= overload (which
    torch.logcumsumexp(..., out=) calls); the executor needs them."""
    for name, fn in (("_logcumsumexp", _logcumsumexp_meta),
                     ("_logcumsumexp.out", _logcumsumexp_out_meta)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib = torch.library.Library("aten", "IMPL", "Meta")
            lib.impl(name, fn)
            _meta_libs.append(lib)


_meta_libs: list = []
_register_missing_meta()


@lower(aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    if x.dtype in _LOW_PRECISION:
        x = x.astype(jnp.float32)
    return lax.associative_scan(_log_add_exp, x, axis=dim % x.ndim)
