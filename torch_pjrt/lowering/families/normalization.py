"""Batch and group normalization, forward (with running statistics) and backward.

Statistics follow PyTorch's CPU kernels: a two-pass biased variance, invstd =
1 / sqrt(var + eps), the output as x * (invstd * weight) + (bias - mean *
invstd * weight), and running_var updated with the unbiased variance. Half
precision inputs compute in float32. In evaluation mode the saved statistics
are the running mean and its invstd (the (C,) shapes PyTorch's meta kernels
give, as on CUDA; the CPU returns empty tensors there).

aten.native_batch_norm is not lowered: it updates running_mean/running_var in
place without saying so in its schema, so it runs through its decomposition,
which writes them with copy_. The variants whose schemas declare the update
(_native_batch_norm_legit, _batch_norm_with_update) are lowered here.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..registry import lower
from ._ops import aten


def _compute_type(x):
    return jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype


def _per_channel(v, ndim):
    """A (C,) vector shaped to broadcast over (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _reduce_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _batch_stats(xf):
    axes = _reduce_axes(xf)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - _per_channel(mean, xf.ndim)), axis=axes)
    return mean, var


def _normalize(x, xf, weight, bias, mean, invstd):
    scale = invstd if weight is None else invstd * weight.astype(xf.dtype)
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias.astype(xf.dtype)
    out = xf * _per_channel(scale, x.ndim) + _per_channel(shift, x.ndim)
    return out.astype(x.dtype)


def _updated(running, batch, momentum):
    if running is None:
        return None
    new = (1 - momentum) * running.astype(batch.dtype) + momentum * batch
    return new.astype(running.dtype)


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    ct = _compute_type(x)
    xf = x.astype(ct)
    if training:
        mean, var = _batch_stats(xf)
        invstd = 1 / jnp.sqrt(var + eps)
        n = x.size // x.shape[1] if x.ndim > 1 else 1
        unbiased = var * (n / (n - 1)) if n > 1 else jnp.full_like(var, jnp.nan)
        new_mean = _updated(running_mean, mean, momentum)
        new_var = _updated(running_var, unbiased, momentum)
    else:
        mean = running_mean.astype(ct)
        invstd = 1 / jnp.sqrt(running_var.astype(ct) + eps)
        new_mean, new_var = running_mean, running_var
    out = _normalize(x, xf, weight, bias, mean, invstd)
    return out, mean, invstd, new_mean, new_var


@lower(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum,
                            eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    return new_mean, new_var, out, mean, invstd


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _batch_norm(x, weight, bias, None, None, True, momentum, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum,
                                        eps):
    out, mean, invstd, _, _ = _batch_norm(
        x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training,
                                       momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, new_mean, new_var


def _no_reserve():
    """The cuDNN reserve space these ops return: empty here."""
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        x, weight, bias, running_mean, running_var, True, momentum, eps)
    return new_mean, new_var, out, mean, invstd, _no_reserve()


@lower(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum,
                                      eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, _no_reserve(), new_mean, new_var


@lower(aten._batch_norm_no_update.default)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None
    out, mean, invstd, _, _ = _batch_norm(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, _no_reserve()


def _batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd,
                         training, eps, output_mask):
    ct = _compute_type(x)
    xf, g = x.astype(ct), grad.astype(ct)
    if training:
        mean, invstd = save_mean.astype(ct), save_invstd.astype(ct)
    else:
        mean = running_mean.astype(ct)
        invstd = 1 / jnp.sqrt(running_var.astype(ct) + eps)
    axes = _reduce_axes(x)
    centered = xf - _per_channel(mean, x.ndim)
    grad_sum = jnp.sum(g, axis=axes)
    dot = jnp.sum(centered * g, axis=axes)
    w = jnp.ones_like(mean) if weight is None else weight.astype(ct)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if training:
            n = x.size // x.shape[1]
            k = dot * invstd * invstd / n
            gi = (g - _per_channel(grad_sum / n, x.ndim) - centered * _per_channel(k, x.ndim))
            gi = gi * _per_channel(invstd * w, x.ndim)
        else:
            gi = g * _per_channel(invstd * w, x.ndim)
        grad_input = gi.astype(x.dtype)
    if output_mask[1]:
        grad_weight = dot * invstd
    if output_mask[2]:
        grad_bias = grad_sum
    return grad_input, grad_weight, grad_bias


def _as_meta_says(grads, meta):
    """Zeros for a masked-out gradient that PyTorch's meta kernel still returns.

    The meta kernels (decompositions) of the batch norm backward ops return
    grad_input even when output_mask[0] is False, where the CPU returns None.
    """
    return tuple(jnp.zeros(m.shape, m.dtype) if g is None and m is not None else g
                 for g, m in zip(grads, meta))


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask, meta):
    grads = _batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                 save_invstd, train, eps, output_mask)
    return _as_meta_says(grads, meta)


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update,
                        eps, output_mask, reserve, meta):
    # save_var holds the saved invstd, as in native_batch_norm_backward.
    grads = _batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                 save_var, update, eps, output_mask)
    return _as_meta_says(grads, meta)


# ---------------------------------------------------------------- group norm
def _grouped(x, n, group):
    """(N, C, *) -> (N, group, C/group * HxW); sizes explicit, N or C may be 0."""
    return x.reshape(n, group, x.size // max(n * group, 1))


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    ct = _compute_type(x)
    xg = _grouped(x.astype(ct), N, group)
    mean = jnp.mean(xg, axis=-1)
    var = jnp.mean(jnp.square(xg - mean[..., None]), axis=-1)
    rstd = 1 / jnp.sqrt(jnp.maximum(var, 0) + eps)
    # Per (n, c): scale = rstd * weight, shift = bias - mean * scale, as the CPU kernel.
    per_group = C // group
    rstd_c = jnp.repeat(rstd, per_group, axis=1)
    mean_c = jnp.repeat(mean, per_group, axis=1)
    scale = rstd_c if weight is None else rstd_c * weight.astype(ct)[None]
    shift = -mean_c * scale
    if bias is not None:
        shift = shift + bias.astype(ct)[None]
    xc = x.astype(ct).reshape(N, C, HxW)
    out = xc * scale[..., None] + shift[..., None]
    return out.reshape(x.shape).astype(x.dtype), mean, rstd


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    ct = _compute_type(x)
    per_group = C // group
    xc = x.astype(ct).reshape(N, C, HxW)
    g = grad.astype(ct).reshape(N, C, HxW)
    mean_c = jnp.repeat(mean.astype(ct), per_group, axis=1)[..., None]
    rstd_c = jnp.repeat(rstd.astype(ct), per_group, axis=1)[..., None]
    xhat = (xc - mean_c) * rstd_c
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g if weight is None else g * weight.astype(ct)[None, :, None]
        count = per_group * HxW
        # Group means of gw and gw * xhat, broadcast back to channels.
        mean_gw = jnp.sum(_grouped(gw, N, group), axis=-1) / count
        mean_gwx = jnp.sum(_grouped(gw * xhat, N, group), axis=-1) / count
        mean_gw = jnp.repeat(mean_gw, per_group, axis=1)[..., None]
        mean_gwx = jnp.repeat(mean_gwx, per_group, axis=1)[..., None]
        gi = rstd_c * (gw - mean_gw - xhat * mean_gwx)
        grad_input = gi.reshape(x.shape).astype(x.dtype)
    if output_mask[1]:
        grad_weight = jnp.sum(g * xhat, axis=(0, 2))
    if output_mask[2]:
        grad_bias = jnp.sum(g, axis=(0, 2))
    return grad_input, grad_weight, grad_bias
