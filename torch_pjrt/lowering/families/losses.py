"""Loss functions and their gradients: binary cross entropy, smooth L1, Huber, soft margin.

Each follows PyTorch's CPU formula term for term (log clamped at -100 in
binary cross entropy, its gradient's denominator at 1e-12, the branch
boundaries of smooth L1 and Huber). Reductions: 0 none, 1 mean, 2 sum.
mse_loss and nll_loss live in nn.py.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import checks
from ..registry import lower
from ._ops import aten

_NONE, _MEAN = 0, 1


def _reduce(loss, reduction):
    if reduction == _NONE:
        return loss
    total = jnp.sum(loss)
    return total / loss.size if reduction == _MEAN else total


def _norm(x, reduction):
    """The gradient's scale: 1/numel under mean reduction."""
    return 1.0 / x.size if reduction == _MEAN else 1.0


@lower(aten.binary_cross_entropy.default, promote="default")
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    checks.require((x >= 0) & (x <= 1), RuntimeError,
                   "all elements of input should be between 0 and 1")
    checks.require((target >= 0) & (target <= 1), RuntimeError,
                   "all elements of target should be between 0 and 1")
    loss = ((target - 1) * jnp.maximum(jnp.log1p(-x), -100)
            - target * jnp.maximum(jnp.log(x), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default, promote="default")
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=_MEAN):
    g = grad * (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        g = g * weight
    return g * _norm(x, reduction) if reduction == _MEAN else g


@lower(aten.binary_cross_entropy_with_logits.default, promote="default")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=_MEAN):
    log_sigmoid = jnp.minimum(x, 0) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * x - log_sigmoid
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lower(aten.smooth_l1_loss.default, promote="default")
def smooth_l1_loss(x, target, reduction=_MEAN, beta=1.0):
    z = jnp.abs(x - target)
    if beta == 0:
        return _reduce(z, reduction)
    return _reduce(jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


@lower(aten.smooth_l1_loss_backward.default, promote="default")
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    d = x - target
    norm = _norm(x, reduction)
    inner = d * grad / beta if beta != 0 else jnp.zeros_like(d)
    return norm * jnp.where(d <= -beta, -grad, jnp.where(d >= beta, grad, inner))


def _reduce_in(loss, reduction, dtype):
    """Huber and soft margin losses: each element is stored in the input's dtype (the
    result's, on CPU and CUDA alike), then reduced, half types accumulating in float32."""
    loss = loss.astype(dtype)
    if reduction == _NONE:
        return loss
    total = jnp.sum(loss, dtype=jnp.promote_types(dtype, jnp.float32))
    return (total / loss.size if reduction == _MEAN else total).astype(dtype)


@lower(aten.huber_loss.default, promote="default")
def huber_loss(x, target, reduction=_MEAN, delta=1.0, *, meta):
    z = jnp.abs(x - target)
    loss = jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))
    return _reduce_in(loss, reduction, meta[0].dtype)


@lower(aten.huber_loss_backward.default, promote="default")
def huber_loss_backward(grad, x, target, reduction, delta):
    d = x - target
    norm = _norm(x, reduction)
    return jnp.where(d <= -delta, -norm * grad * delta,
                     jnp.where(d >= delta, norm * grad * delta, norm * d * grad))


@lower(aten.soft_margin_loss.default, promote="default")
def soft_margin_loss(x, target, reduction=_MEAN, *, meta):
    return _reduce_in(jnp.log1p(jnp.exp(-target * x)), reduction, meta[0].dtype)


@lower(aten.soft_margin_loss_backward.default, promote="default")
def soft_margin_loss_backward(grad, x, target, reduction):
    z = jnp.exp(-target * x)
    return target * z * -_norm(x, reduction) / (1 + z) * grad
