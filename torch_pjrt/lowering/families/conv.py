"""Convolutions (1d/2d/3d, grouped, dilated, transposed) and their gradients.

PyTorch's layouts are kept: input (N, C, *spatial), weight (O, C/groups, *kernel)
and, for transposed convolutions, weight (C, O/groups, *kernel). Every
gradient is itself one XLA convolution:

- input gradient of a convolution: a transposed convolution of grad_output with
  the same weight (and the reverse for a transposed convolution);
- weight gradient: the input correlated with grad_output, batch and channel
  axes swapped, one `batch_group_count` group per convolution group.

On the cpu platform, a convolution with a small output image or few input channels runs
as one matrix product of its patches instead (`_patches_conv`, pure XLA too): XLA:CPU's
convolution is slow there (a ResNet's 256-channel 3x3 convolution of a 2x2 image, batch
32: 21.7 ms forward against 1.2 ms as patches, and 0.65 ms in PyTorch's oneDNN kernel).
`TORCH_PJRT_CONV_PATCHES=0` keeps XLA's convolution everywhere.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ... import _env
from ...runtime import client
from ..registry import lower
from ._ops import aten
from .linalg import precision


def _acc_type(dtype):
    """Half-precision convolutions accumulate in float32, as PyTorch's do."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else None


def _numbers(nd: int, batch: int = 0, feature: int = 1) -> lax.ConvDimensionNumbers:
    """Dimension numbers for arrays laid out (batch/out, feature/in, *spatial)."""
    spatial = tuple(range(2, nd + 2))
    lead = (batch, feature)
    return lax.ConvDimensionNumbers(lead + spatial, lead + spatial, lead + spatial)


def _conv(x, w, stride, padding, dilation, groups, lhs_dilation=None):
    """Cross-correlation in PyTorch's layouts; padding is a list of (low, high) pairs."""
    return lax.conv_general_dilated(
        x, w, tuple(stride), padding, lhs_dilation=lhs_dilation, rhs_dilation=tuple(dilation),
        dimension_numbers=_numbers(x.ndim - 2), feature_group_count=groups,
        precision=precision(), preferred_element_type=_acc_type(x.dtype))


def _use_patches(x, w, out_spatial, groups) -> bool:
    """Whether the convolution runs as a product of patches: on the cpu platform, for a
    plain (ungrouped, not transposed) convolution whose output image has at most 64
    positions or whose patches have at most 32 values (a network's first layer). Measured
    on the ResNet of bench/models.py, each layer forward and backward in pure jax.jit:
    XLA's convolutions 94 ms, these rules' mix 41 ms, all as patches 43 ms (patches lose
    on 16x16 images of 32 channels: 9.1 against 6.5 ms)."""
    if groups != 1 or not _env.flag("TORCH_PJRT_CONV_PATCHES"):
        return False
    if client.platform() != "cpu":
        return False
    return math.prod(out_spatial) <= 64 or x.shape[1] * math.prod(w.shape[2:]) <= 32


def _out_spatial(x, w, stride, padding, dilation) -> list[int]:
    return [(n + lo + hi - d * (k - 1) - 1) // s + 1 for n, (lo, hi), k, s, d in
            zip(x.shape[2:], padding, w.shape[2:], stride, dilation)]


def _patches_conv(x, w, stride, padding, dilation):
    """The convolution as patches [N, C * K, P] (one strided slice of the padded input
    per kernel position) times the weight [O, C * K]: one matrix product. Half precision
    computes in float32 (also the backward's sums over overlapping patches), rounded once
    by the caller, as PyTorch's kernels accumulate."""
    acc = _acc_type(x.dtype)
    if acc is not None:
        x, w = x.astype(acc), w.astype(acc)
    n, c = x.shape[:2]
    o, kernel = w.shape[0], w.shape[2:]
    out = _out_spatial(x, w, stride, padding, dilation)
    xp = jnp.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in padding])
    cols = []
    for pos in itertools.product(*[range(k) for k in kernel]):
        window = tuple(slice(t * d, t * d + (m - 1) * s + 1, s)
                       for t, d, m, s in zip(pos, dilation, out, stride))
        cols.append(xp[(slice(None), slice(None)) + window])
    patches = jnp.stack(cols, 2).reshape(n, c * math.prod(kernel), math.prod(out))
    y = jnp.einsum("nkp,ok->nop", patches, w.reshape(o, -1), precision=precision())
    return y.reshape(n, o, *out)


def _transposed_weight(w, groups):
    """(C, O/groups, *k) -> (O, C/groups, *k), flipped in space: the correlation kernel."""
    c, o_per_group = w.shape[:2]
    kernel = w.shape[2:]
    w = w.reshape(groups, c // groups, o_per_group, *kernel).swapaxes(1, 2)
    w = w.reshape(groups * o_per_group, c // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def _conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    """The adjoint of `_conv` with the same weight: input dilated by the stride."""
    kernel = w.shape[2:]
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)]
    return _conv(x, _transposed_weight(w, groups), (1,) * len(kernel), pads, dilation, groups,
                 lhs_dilation=tuple(stride))


def _weight_grad(a, g, kernel, stride, padding, dilation, groups):
    """d<g, conv(a, w)>/dw, shaped (O, C/groups, *kernel).

    gw[o, i, t] = sum over n, j of g[n, o, j] * a_padded[n, group(o) * C/groups + i, j*s + t*d]:
    a correlation of `a` with `g` over the batch axis, stride and dilation exchanged.
    """
    pads = []
    for k, s, p, d, n_in, n_out in zip(kernel, stride, padding, dilation, a.shape[2:],
                                       g.shape[2:]):
        # The high padding is what makes the result exactly `k` long (negative: input
        # elements the strided windows never reached).
        pads.append((p, d * (k - 1) + s * (n_out - 1) + 1 - n_in - p))
    numbers = _numbers(a.ndim - 2, batch=1, feature=0)
    return lax.conv_general_dilated(
        a, g, tuple(dilation), pads, rhs_dilation=tuple(stride), dimension_numbers=numbers,
        batch_group_count=groups, precision=precision(),
        preferred_element_type=_acc_type(a.dtype))


def _per_dim(nd: int, *params):
    """PyTorch's int[] arguments: one value for every spatial dim, or one per dim."""
    return [tuple(p) * nd if len(p) == 1 else tuple(p) for p in params]


def _add_bias(out, bias):
    if bias is None:
        return out
    return out + bias.reshape((1, -1) + (1,) * (out.ndim - 2)).astype(out.dtype)


def _check_params(stride, padding, dilation, output_padding) -> None:
    """The CPU kernel's checks of the parameters, in its order (PyTorch's meta kernel for
    convolution has none of them)."""
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(p < 0 for p in output_padding):
        raise RuntimeError("negative output_padding is not supported")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")


@lower(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_params(stride, padding, dilation, output_padding)
    stride, padding, dilation, output_padding = _per_dim(
        x.ndim - 2, stride, padding, dilation, output_padding)
    pads = [(p, p) for p in padding]
    if transposed:
        out = _conv_transpose(x, w, stride, padding, dilation, output_padding, groups)
    elif _use_patches(x, w, _out_spatial(x, w, stride, pads, dilation), groups):
        out = _patches_conv(x, w, stride, pads, dilation)
    else:
        out = _conv(x, w, stride, pads, dilation, groups)
    return _add_bias(out, bias).astype(x.dtype)


@lower(aten._convolution.default)
def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                 benchmark, deterministic, cudnn_enabled, allow_tf32):
    return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lower(aten._convolution.deprecated)
def _convolution_deprecated(x, w, bias, stride, padding, dilation, transposed, output_padding,
                            groups, benchmark, deterministic, cudnn_enabled):
    return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lower(aten.convolution_backward.default)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    kernel = w.shape[2:]
    stride, padding, dilation, output_padding = _per_dim(
        x.ndim - 2, stride, padding, dilation, output_padding)
    grad_input = grad_weight = grad_bias = None
    pads = [(p, p) for p in padding]
    if (not transposed and (output_mask[0] or output_mask[1])
            and _use_patches(x, w, grad.shape[2:], groups)):
        # the gradients of the patches' product: slices' adjoints (pads) and products
        _, vjp = jax.vjp(lambda x, w: _patches_conv(x, w, stride, pads, dilation), x, w)
        gi, gw = vjp(grad.astype(_acc_type(grad.dtype) or grad.dtype))
        grad_input = gi.astype(x.dtype) if output_mask[0] else None
        grad_weight = gw.astype(w.dtype) if output_mask[1] else None
        output_mask = (False, False, output_mask[2])
    if output_mask[0]:
        if transposed:
            # A transposed convolution's input gradient is the plain convolution.
            gi = _conv(grad, w, stride, [(p, p) for p in padding], dilation, groups)
            gi = gi[(slice(None), slice(None)) + tuple(slice(0, n) for n in x.shape[2:])]
        else:
            # The input elements past the last window get no gradient: output_padding
            # makes the transposed convolution exactly as long as the input.
            residual = [n - ((m - 1) * s - 2 * p + d * (k - 1) + 1) for n, m, s, p, d, k in
                        zip(x.shape[2:], grad.shape[2:], stride, padding, dilation, kernel)]
            gi = _conv_transpose(grad, w, stride, padding, dilation, residual, groups)
        grad_input = gi.astype(x.dtype)
    if output_mask[1]:
        if transposed:  # y = conv_transpose(x, w) is the adjoint of conv(., w): roles swap
            gw = _weight_grad(grad, x, kernel, stride, padding, dilation, groups)
        else:
            gw = _weight_grad(x, grad, kernel, stride, padding, dilation, groups)
        grad_weight = gw.astype(w.dtype)
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad.ndim))
        acc = _acc_type(grad.dtype)
        grad_bias = jnp.sum(grad, axis=axes, dtype=acc).astype(grad.dtype)
    return grad_input, grad_weight, grad_bias
