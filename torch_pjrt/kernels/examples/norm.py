"""Fused RMSNorm as a Pallas kernel: y = x / sqrt(mean(x^2) + eps) * weight over the last
axis, one row block per program; the backward recomputes each row's scale instead of
saving it, and sums the weight gradient per row block."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from ..register import register_jax
from ._blocks import NAMESPACE, block, pad_to, pl

ROWS = 64  # rows per program


# ------------------------------------------------------------------ the Pallas kernels
def _forward_kernel(x_ref, w_ref, y_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps)
    y_ref[...] = (x * rstd * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)


def _backward_kernel(g_ref, x_ref, w_ref, dx_ref, dw_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    g = g_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps)
    xhat = x * rstd
    dxhat = g * w_ref[...].astype(jnp.float32)
    dx = rstd * (dxhat - xhat * jnp.mean(dxhat * xhat, axis=1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(g * xhat, axis=0, keepdims=True)


def _rows(x):
    """x as [rows, D] padded to whole row blocks, the block length, and the rows."""
    x2 = x.reshape(-1, x.shape[-1])
    rows = block(x2.shape[0], ROWS)
    return pad_to(x2, 0, rows), rows, x2.shape[0]


def forward(x, weight, eps: float):
    """The JAX function: RMSNorm of `x` over its last axis."""
    x2, rows, n = _rows(x)
    d = x2.shape[1]
    y = pl.pallas_call(
        functools.partial(_forward_kernel, eps=eps),
        out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype),
        grid=(x2.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, d), lambda i: (i, 0)),
    )(x2, weight.reshape(1, d))
    return y[:n].reshape(x.shape)


def backward(grad, x, weight, eps: float):
    """The JAX function: (dx, dweight)."""
    x2, rows, n = _rows(x)
    g2 = pad_to(grad.reshape(-1, x.shape[-1]), 0, rows)
    d, blocks = x2.shape[1], x2.shape[0] // rows
    dx, dw = pl.pallas_call(
        functools.partial(_backward_kernel, eps=eps),
        out_shape=(jax.ShapeDtypeStruct(x2.shape, x.dtype),
                   jax.ShapeDtypeStruct((blocks, d), jnp.float32)),
        grid=(blocks,),
        in_specs=[pl.BlockSpec((rows, d), lambda i: (i, 0)),
                  pl.BlockSpec((rows, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=(pl.BlockSpec((rows, d), lambda i: (i, 0)),
                   pl.BlockSpec((1, d), lambda i: (i, 0))),
    )(g2, x2, weight.reshape(1, d))
    return dx[:n].reshape(x.shape), jnp.sum(dw, axis=0).astype(weight.dtype)


# ------------------------------------------------------------------ the operators
@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()) \
        .to(x.dtype)


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::rms_norm_backward", mutates_args=())
def _rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xf, g = x.float(), grad.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dxhat = g * weight.float()
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    dw = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


@_rms_norm_backward.register_fake
def _(grad, x, weight, eps):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = _rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, dw, None


_rms_norm.register_autograd(_backward, setup_context=_setup)
register_jax(_rms_norm, forward)
register_jax(_rms_norm_backward, backward)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of `x` over its last axis scaled by `weight` (as F.rms_norm with
    normalized_shape=(D,)): the Pallas kernel on pjrt, PyTorch's math on CPU."""
    return _rms_norm(x, weight, eps)
