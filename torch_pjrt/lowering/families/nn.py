"""Neural-network ops: softmax, layer norm, embedding, losses, dropout (forward and backward).

Token ids and class targets are checked on the device (lowering.checks): one out of
range raises PyTorch's IndexError at the next synchronization, never a clamped row.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ...runtime import client, cpu_kernels
from ...storage import dtypes
from ..checks import index_dtype, require
from ..registry import lower
from ._ops import aten


def _upcast(x):
    """Low-precision floats compute in float32, as PyTorch's CPU kernels do."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


@lower(aten._softmax.default)
def softmax(x, dim, half_to_float):
    y = jax.nn.softmax(_upcast(x), axis=dim) if x.ndim else jnp.ones_like(_upcast(x))
    return y if half_to_float else y.astype(x.dtype)


@lower(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    y = jax.nn.log_softmax(_upcast(x), axis=dim) if x.ndim else jnp.zeros_like(_upcast(x))
    return y if half_to_float else y.astype(x.dtype)


@lower(aten._softmax_backward_data.default)
def softmax_backward(grad, out, dim, input_dtype):
    g, y = _upcast(grad), _upcast(out)
    axis = dim if y.ndim else None  # a 0-d softmax is over its one element
    return (y * (g - jnp.sum(g * y, axis=axis, keepdims=True))).astype(dtypes.to_jax(input_dtype))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, out, dim, input_dtype):
    g, y = _upcast(grad), _upcast(out)
    axis = dim if y.ndim else None
    dx = g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)
    return dx.astype(dtypes.to_jax(input_dtype))


def _norm_axes(x, normalized_shape):
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@lower(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    if bias is not None and cpu_kernels.layer_norm_applies(x, normalized_shape, weight, bias):
        return cpu_kernels.layer_norm(x, normalized_shape, weight, bias, eps)
    axes = _norm_axes(x, normalized_shape)
    xf = _upcast(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype), mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    if grad.dtype == jnp.float32 and cpu_kernels.layer_norm_applies(x, normalized_shape, weight):
        dx, dw, db = cpu_kernels.layer_norm_backward(grad, x, normalized_shape, mean, rstd,
                                                     weight)
        return (dx if output_mask[0] else None, dw if output_mask[1] else None,
                db if bias is not None and output_mask[2] else None)
    axes = _norm_axes(x, normalized_shape)
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    g, xf = _upcast(grad), _upcast(x)
    xhat = (xf - mean) * rstd
    gw = g * weight if weight is not None else g
    n = math.prod(normalized_shape)
    dx = rstd / n * (n * gw - jnp.sum(gw, axis=axes, keepdims=True)
                     - xhat * jnp.sum(gw * xhat, axis=axes, keepdims=True))
    dw = jnp.sum(g * xhat, axis=batch_axes) if weight is not None and output_mask[1] else None
    db = jnp.sum(g, axis=batch_axes) if bias is not None and output_mask[2] else None
    return (dx.astype(x.dtype) if output_mask[0] else None, dw, db)


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    rows = weight.shape[0]
    require((indices >= 0) & (indices < rows), IndexError,
            f"index out of range in self (embedding: index {{0}}, weight of {rows} rows)",
            indices)
    return jnp.take(weight, indices, axis=0, mode="clip")


_SCATTER_PLATFORMS = ("cpu", "gpu", "cuda", "rocm")


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    # As the CPU kernel does, rows outside [0, num_weights) get nothing (the forward has
    # raised for them): they go to row num_weights, which the scatter drops.
    flat_idx = indices.reshape(-1)
    flat_idx = jnp.where((flat_idx >= 0) & (flat_idx < num_weights), flat_idx, num_weights)
    g = grad.reshape(-1, grad.shape[-1])
    if padding_idx >= 0:
        g = jnp.where((flat_idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat_idx].add(1, mode="drop")
        g = g / counts[jnp.minimum(flat_idx, num_weights - 1)][:, None]
    # TPUs sum rows fastest as a one-hot product; CPUs and GPUs scatter-add them (XLA:CPU,
    # the GPT bench's 1024 rows of 256 into 512: 0.13 ms scattered, 2.3 ms as a product).
    if client.platform() not in _SCATTER_PLATFORMS and num_weights * flat_idx.shape[0] <= (1 << 26):
        onehot = (flat_idx[None, :] == jnp.arange(num_weights)[:, None]).astype(g.dtype)
        return jnp.matmul(onehot, g, precision=lax.Precision.HIGHEST)
    return jnp.zeros((num_weights, g.shape[-1]), g.dtype).at[flat_idx].add(g, mode="drop")


@lower(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, key):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    scale = 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), 0), keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * jnp.asarray(scale, grad.dtype)


def _check_target(t, ignore_index, classes):
    """Require each target to be a class or ignore_index; returns the valid mask."""
    index_dtype(t, (jnp.int64, jnp.uint8), RuntimeError,
                "expected target dtype to be Long or Byte, but got {0}")
    valid = t != ignore_index
    require(~valid | ((t >= 0) & (t < classes)), IndexError, "Target {0} is out of bounds.",
            t)
    return valid


def _reduce(loss, reduction, weight_sum=None):
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.sum(loss) / (weight_sum if weight_sum is not None else loss.size)
    return jnp.sum(loss)


@lower(aten.nll_loss_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    batched = x.ndim == 2
    logp = x if batched else x[None]
    t = target if batched else target[None]
    valid = _check_target(t, ignore_index, logp.shape[1])
    safe = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = weight[safe] if weight is not None else jnp.ones_like(picked)
    w = jnp.where(valid, w, 0).astype(x.dtype)
    loss = -picked * w
    total = jnp.sum(w)
    if reduction == 0:
        out = loss if batched else loss[0]
    elif reduction == 1:
        out = jnp.sum(loss) / total
    else:
        out = jnp.sum(loss)
    return out, total


@lower(aten.nll_loss_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    batched = x.ndim == 2
    t = target if batched else target[None]
    n, c = (x.shape if batched else (1, x.shape[0]))
    valid = _check_target(t, ignore_index, c)
    safe = jnp.where(valid, t, 0)
    w = weight[safe] if weight is not None else jnp.ones((n,), x.dtype)
    w = jnp.where(valid, w, 0).astype(x.dtype)
    if reduction == 0:
        g = (grad if batched else grad[None]) * w
    elif reduction == 1:
        g = grad * w / total_weight
    else:
        g = grad * w
    onehot = (jnp.arange(c)[None, :] == safe[:, None]).astype(x.dtype)
    dx = -onehot * g[:, None]
    return dx if batched else dx[0]


@lower(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    # (N, C, H, W) -> (N*H*W, C)
    c = x.shape[1]
    flat = jnp.moveaxis(x, 1, -1).reshape(-1, c)
    loss, total = nll_loss_forward(flat, target.reshape(-1), weight, reduction, ignore_index)
    if reduction == 0:
        loss = loss.reshape(target.shape)
    return loss, total


@lower(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    c = x.shape[1]
    flat = jnp.moveaxis(x, 1, -1).reshape(-1, c)
    g = grad.reshape(-1) if reduction == 0 else grad
    dx = nll_loss_backward(g, flat, target.reshape(-1), weight, reduction, ignore_index,
                           total_weight)
    return jnp.moveaxis(dx.reshape(x.shape[:1] + x.shape[2:] + (c,)), -1, 1)


@lower(aten.mse_loss.default, promote="default")
def mse_loss(x, target, reduction=1):
    return _reduce(jnp.square(x - target), reduction)


@lower(aten.mse_loss_backward.default, promote="default")
def mse_loss_backward(grad, x, target, reduction):
    scale = 2.0 / x.size if reduction == 1 else 2.0
    return grad * (x - target) * jnp.asarray(scale, x.dtype)
