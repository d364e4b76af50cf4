"""Loss functions and their gradients: binary cross entropy, smooth L1, Huber, soft margin,
the multi-class and multi-label margin losses.

Each follows PyTorch's CPU formula term for term (log clamped at -100 in
binary cross entropy, its gradient's denominator at 1e-12, the branch
boundaries of smooth L1 and Huber). Reductions: 0 none, 1 mean, 2 sum.
mse_loss and nll_loss live in nn.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

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


# ------------------------------------------------------------------ margin losses over classes
def _class_rows(x):
    """The input as (frames, classes): a vector is one frame, a number one frame of one."""
    return x.reshape(1, 1) if x.ndim == 0 else x.reshape(-1, x.shape[-1])


def _reduce_frames(per_frame, reduction, shape):
    if reduction == _NONE:
        return per_frame.reshape(shape)
    total = jnp.sum(per_frame)
    return total / per_frame.shape[0] if reduction == _MEAN else total


@lower(aten.multi_margin_loss.default, static=("p", "margin"))
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=_MEAN, *, meta):
    # Each frame: sum over the other classes i of max(0, margin - x[y] + x[i]) ** p (times
    # weight[y]), over the number of classes. A target outside the classes is the CPU's
    # error (CUDA's device assert).
    checks.expect_dtype(target)
    if weight is not None:
        checks.expect_dtype(weight, x.dtype)
    rows = _class_rows(x)
    classes = rows.shape[1]
    t = target.reshape(-1)
    checks.require((t >= 0) & (t < classes), RuntimeError, "target out of range")
    t = jnp.clip(t, 0, classes - 1)[:, None]
    z = jnp.maximum(margin - jnp.take_along_axis(rows, t, axis=1) + rows, 0)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * weight.reshape(-1)[t]
    z = jnp.where(jnp.arange(classes)[None, :] == t, 0, z)
    return _reduce_frames(jnp.sum(z, axis=1) / classes, reduction, meta[0].shape)


@lower(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(x, target, reduction, *, meta):
    # A frame's targets are its target entries before the first -1; each pair (target j,
    # other class i) adds max(0, 1 - x[j] + x[i]), over the number of classes. Every entry,
    # after the -1 too, must be -1 or a class (the CPU's check). is_target marks the targets.
    checks.expect_dtype(target)
    rows = _class_rows(x)
    frames, classes = rows.shape
    t = target.reshape(frames, classes)
    checks.require((t >= -1) & (t < classes), RuntimeError,
                   "argument #2 'target' is out of range")
    live = jnp.cumsum(t < 0, axis=1) == 0
    t = jnp.where(live, t, 0)
    is_target = jnp.any((t[:, :, None] == jnp.arange(classes)) & live[:, :, None], axis=1)
    z = jnp.maximum(1 - jnp.take_along_axis(rows, t, axis=1)[:, :, None] + rows[:, None, :], 0)
    z = jnp.where(live[:, :, None] & ~is_target[:, None, :], z, 0)
    loss = _reduce_frames(jnp.sum(z, axis=(1, 2)) / classes, reduction, meta[0].shape)
    return loss, is_target.astype(x.dtype).reshape(meta[1].shape)




def _frame_scale(grad, reduction, frames, classes):
    """The gradient's factor per frame: grad / classes (and / frames under mean)."""
    if reduction == _NONE:
        return grad.reshape(-1, 1) / classes
    return jnp.broadcast_to(grad / (classes * (frames if reduction == _MEAN else 1)),
                            (frames, 1))


@lower(aten.multi_margin_loss_backward.default, static=("p", "margin"))
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=_MEAN):
    checks.expect_dtype(target)
    rows = _class_rows(x)
    frames, classes = rows.shape
    t = target.reshape(-1)
    checks.require((t >= 0) & (t < classes), RuntimeError, "target out of range")
    t = jnp.clip(t, 0, classes - 1)[:, None]
    z = margin - jnp.take_along_axis(rows, t, axis=1) + rows
    other = jnp.arange(classes)[None, :] != t
    h = jnp.where(other & (z > 0), 1 if p == 1 else 2 * z, 0)
    if weight is not None:
        h = h * weight.reshape(-1)[t]
    h = h * _frame_scale(grad, reduction, frames, classes)
    dx = h - jnp.where(other, 0, jnp.sum(h, axis=1, keepdims=True))
    return dx.astype(x.dtype).reshape(x.shape)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    checks.expect_dtype(target)
    rows = _class_rows(x)
    frames, classes = rows.shape
    t = target.reshape(frames, classes)
    checks.require((t >= -1) & (t < classes), RuntimeError,
                   "argument #2 'target' is out of range")
    live = jnp.cumsum(t < 0, axis=1) == 0
    t = jnp.where(live, t, 0)
    others = is_target.reshape(frames, classes) == 0
    z = 1 - jnp.take_along_axis(rows, t, axis=1)[:, :, None] + rows[:, None, :]
    hit = (live[:, :, None] & others[:, None, :] & (z > 0)).astype(x.dtype)  # (frame, j, i)
    down = jnp.zeros_like(rows).at[jnp.arange(frames)[:, None], t].add(jnp.sum(hit, axis=2))
    dx = (jnp.sum(hit, axis=1) - down) * _frame_scale(grad, reduction, frames, classes)
    return dx.astype(x.dtype).reshape(x.shape)


def _multi_margin_meta(x, target, p=1, margin=1, weight=None, reduction=_MEAN):
    frames = x.shape[0] if x.dim() == 2 else 1
    return x.new_empty((frames,) if reduction == _NONE and target.dim() > 0 else ())


def _multilabel_margin_meta(x, target, reduction):
    frames = x.shape[0] if x.dim() == 2 else 1
    shape = (frames,) if reduction == _NONE and target.dim() > 1 else ()
    return x.new_empty(shape), x.new_empty(target.shape)


def _register_metas() -> None:
    """Meta kernels for the margin losses: PyTorch's for the forwards are torch._decomp's
    decompositions, whose unreduced loss of one frame has the shape (1,) (the CPU's and
    CUDA's: ()); it has none for the backwards (the gradient is shaped as the input)."""
    lib = torch.library.Library("aten", "IMPL", "Meta")
    lib.impl("multi_margin_loss", _multi_margin_meta)
    lib.impl("multilabel_margin_loss_forward", _multilabel_margin_meta)
    for name in ("multi_margin_loss_backward", "multilabel_margin_loss_backward"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, lambda grad, x, *rest: torch.empty_like(x))
    _meta_libs.append(lib)


_meta_libs: list = []
_register_metas()

def _keep_whole_when_traced() -> None:
    """torch._decomp registers its decompositions of the two margin losses for the Autograd
    key, which the tracing of torch.compile (the Python dispatcher) runs on every backend;
    they take int32 targets and count the targets after a -1 (the docs' example
    F.multilabel_margin_loss([[.1, .2, .4, .8]], [[3, 0, -1, 1]]) gives 2.05 under
    aot_eager, 0.85 in eager). Without them the traced graph keeps the op, which the lowering
    above computes as the CPU does. Backends with a decomposition table of their own
    (Inductor's) still decompose it there."""
    from torch._C import DispatchKey

    for op in (aten.multi_margin_loss.default, aten.multilabel_margin_loss_forward.default):
        if op.py_kernels.pop(DispatchKey.Autograd, None) is not None:
            op._dispatch_cache.clear()


_keep_whole_when_traced()
