"""Discrete Fourier transforms: the three ATen primitives behind torch.fft.

`normalization` is PyTorch's fft_norm_mode: 0 leaves the transform unscaled,
1 scales by 1/sqrt(n), 2 by 1/n, where n is the number of points of the signal
(for c2r, of the real output). Every transform here is computed unscaled and
then scaled once.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ..registry import lower
from ._ops import aten


def _axes(x, dim) -> tuple[int, ...]:
    return tuple(d % x.ndim for d in dim)


def _normalize(out, n: int, normalization: int):
    if normalization == 0 or n == 0:
        return out
    scale = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return out * jnp.asarray(scale, out.real.dtype)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    axes = _axes(x, dim)
    if not axes:
        return x
    # numpy's norm="backward" leaves the forward transform unscaled, "forward" the inverse.
    out = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _normalize(out, math.prod(x.shape[a] for a in axes), normalization)


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    axes = _axes(x, dim)
    n = math.prod(x.shape[a] for a in axes)
    if onesided:
        out = jnp.fft.rfftn(x, axes=axes)
    else:
        complex_dtype = jnp.result_type(x.dtype, jnp.complex64)
        out = jnp.fft.fftn(x.astype(complex_dtype), axes=axes)
    return _normalize(out, n, normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    axes = _axes(x, dim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _normalize(out, math.prod(sizes), normalization)
