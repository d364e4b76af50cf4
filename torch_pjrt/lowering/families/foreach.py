"""The _foreach_* and _fused_* optimizer ops: one program for a whole list of tensors.

PyTorch's CPU foreach kernels apply the single-tensor op to each tensor in turn,
so each lowering here applies the single-tensor op's own lowering (looked up in
the table) to each tensor, in the computation dtype of that tensor's result:
tensors of different dtypes in one list are promoted each on its own. The fused
optimizer steps follow PyTorch's CPU kernels (FusedAdam, FusedSGD, FusedAdagrad).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .. import registry
from ..registry import lower
from ._ops import aten

_HALF = (jnp.float16, jnp.bfloat16)


def _compute_dtype(out_dtype, *operands):
    """The dtype a single-tensor op computes its result of `out_dtype` in (PyTorch's opmath:
    float32 for half types; a complex operand keeps its type, e.g. abs of complex)."""
    for x in operands:
        dt = getattr(x, "dtype", None)
        if dt is not None and jnp.issubdtype(dt, jnp.complexfloating) and \
                not jnp.issubdtype(out_dtype, jnp.complexfloating):
            return dt
    return jnp.float32 if out_dtype in _HALF else out_dtype


def _cast(v, dtype):
    """An operand in the computation dtype; Python numbers stay Python numbers, as the
    machinery passes them to the single-tensor lowerings."""
    if v is None or isinstance(v, (bool, int, float, complex)):
        return v
    return jnp.asarray(v).astype(dtype)


def _apply(op, out, *operands, **params):
    """`op`'s lowering on operands cast to the computation dtype of result `out`."""
    low = registry.get(op)
    dtype = _compute_dtype(out.dtype, *operands)
    args = [_cast(v, dtype) for v in operands]
    if low.wants_meta:
        params["meta"] = [out]
    return low.fn(*args, **params)


def _per_tensor(values, n):
    """A Tensor[] / Scalar[] argument as a list, or one value repeated n times."""
    if isinstance(values, (list, tuple)):
        return list(values)
    if hasattr(values, "ndim") and values.ndim == 1:  # a 1-D tensor of scalars
        return [values[i] for i in range(n)]
    return [values] * n


# ---------------------------------------------------------------------- unary
_UNARY = {
    "abs": aten.abs.default, "acos": aten.acos.default, "asin": aten.asin.default,
    "atan": aten.atan.default, "ceil": aten.ceil.default, "cos": aten.cos.default,
    "cosh": aten.cosh.default, "erf": aten.erf.default, "erfc": aten.erfc.default,
    "exp": aten.exp.default, "expm1": aten.expm1.default, "floor": aten.floor.default,
    "frac": aten.frac.default, "lgamma": aten.lgamma.default, "log": aten.log.default,
    "log10": aten.log10.default, "log1p": aten.log1p.default, "log2": aten.log2.default,
    "neg": aten.neg.default, "reciprocal": aten.reciprocal.default,
    "round": aten.round.default, "rsqrt": aten.rsqrt.default,
    "sigmoid": aten.sigmoid.default, "sign": aten.sign.default, "sin": aten.sin.default,
    "sinh": aten.sinh.default, "sqrt": aten.sqrt.default, "tan": aten.tan.default,
    "tanh": aten.tanh.default, "trunc": aten.trunc.default,
}


_TORCH_NAMES = {jnp.dtype(jnp.int64): "Long", jnp.dtype(jnp.int32): "Int",
                jnp.dtype(jnp.int16): "Short", jnp.dtype(jnp.int8): "Char",
                jnp.dtype(jnp.uint8): "Byte", jnp.dtype(jnp.bool_): "Bool"}


def _require_float(x, kernel):
    """PyTorch's CPU error for a float-only kernel given an integer tensor."""
    if x.dtype in _TORCH_NAMES:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_TORCH_NAMES[x.dtype]}\'')


def _unary(op):
    def lowering(xs, *, meta):
        if op is aten.frac.default:
            for x in xs:
                _require_float(x, "frac_cpu")
        return [_apply(op, m, x) for x, m in zip(xs, meta)]

    lowering.__name__ = f"foreach_{op._schema.name.split('::')[1]}"
    return lowering


for _name, _op in _UNARY.items():
    lower(getattr(aten, f"_foreach_{_name}").default)(_unary(_op))


# --------------------------------------------------------------------- binary
def _scalar_overload(op) -> bool:
    """Whether an overload takes numbers (Scalar, Scalar[]) where its kin take tensors."""
    return op._overloadname in ("Scalar", "ScalarList")


_BOOL_SUB = ("Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
             "trying to invert a mask, use the `~` or `logical_not()` operator instead.")


def _binary(tensor_op, scalar_op, overloads):
    """_foreach_X.{List,Tensor,Scalar,ScalarList}: X applied to each (x, other) pair, with
    the Scalar overload of X for the overloads that take numbers."""
    for overload in overloads:
        op = scalar_op if _scalar_overload(overload) else tensor_op

        def lowering(xs, others, *, meta, op=op, **params):
            out = []
            for x, y, m in zip(xs, _per_tensor(others, len(xs)), meta):
                if op in (aten.sub.Tensor, aten.sub.Scalar) and (
                        isinstance(y, bool) or jnp.bool_ in (x.dtype, getattr(y, "dtype", None))):
                    raise RuntimeError(_BOOL_SUB)
                kw = {"alpha": _cast(params["alpha"], _compute_dtype(m.dtype, x))} \
                    if "alpha" in params else {}
                out.append(_apply(op, m, x, y, **kw))
            return out

        lowering.__name__ = f"foreach_{tensor_op._schema.name.split('::')[1]}"
        lower(overload)(lowering)


_binary(aten.add.Tensor, aten.add.Scalar,
        (aten._foreach_add.List, aten._foreach_add.Tensor, aten._foreach_add.Scalar,
         aten._foreach_add.ScalarList))
_binary(aten.sub.Tensor, aten.sub.Scalar,
        (aten._foreach_sub.List, aten._foreach_sub.Scalar, aten._foreach_sub.ScalarList))
_binary(aten.mul.Tensor, aten.mul.Scalar,
        (aten._foreach_mul.List, aten._foreach_mul.Tensor, aten._foreach_mul.Scalar,
         aten._foreach_mul.ScalarList))
_binary(aten.div.Tensor, aten.div.Scalar,
        (aten._foreach_div.List, aten._foreach_div.Tensor, aten._foreach_div.Scalar,
         aten._foreach_div.ScalarList))
# PyTorch's CPU kernels: maximum/minimum for lists, clamp_min/clamp_max for scalars.
_binary(aten.maximum.default, aten.clamp_min.default,
        (aten._foreach_maximum.List, aten._foreach_maximum.Scalar,
         aten._foreach_maximum.ScalarList))
_binary(aten.minimum.default, aten.clamp_max.default,
        (aten._foreach_minimum.List, aten._foreach_minimum.Scalar,
         aten._foreach_minimum.ScalarList))
_binary(aten.clamp_min.Tensor, aten.clamp_min.default,
        (aten._foreach_clamp_min.List, aten._foreach_clamp_min.Scalar,
         aten._foreach_clamp_min.ScalarList))
_binary(aten.clamp_max.Tensor, aten.clamp_max.default,
        (aten._foreach_clamp_max.List, aten._foreach_clamp_max.Scalar,
         aten._foreach_clamp_max.ScalarList))
_binary(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar,
        (aten._foreach_pow.List, aten._foreach_pow.Scalar, aten._foreach_pow.ScalarList))


@lower(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(base, exponents, *, meta):
    return [_apply(aten.pow.Scalar, m, base, e) for e, m in zip(exponents, meta)]


def _lerp(scalar: bool):
    op, kernel = (aten.lerp.Scalar, "lerp_kernel_scalar") if scalar else \
        (aten.lerp.Tensor, "lerp_kernel_tensor")

    def foreach_lerp(xs, ends, weight, *, meta):
        out = []
        for x, e, w, m in zip(xs, ends, _per_tensor(weight, len(xs)), meta):
            _require_float(x, kernel)
            out.append(_apply(op, m, x, e, w))
        return out

    return foreach_lerp


lower(aten._foreach_lerp.List)(_lerp(scalar=False))
lower(aten._foreach_lerp.Scalar, aten._foreach_lerp.ScalarList)(_lerp(scalar=True))


def _pointwise(op):
    def lowering(xs, t1, t2, scalars=1, *, meta):
        return [_apply(op, m, x, a, b, value=_cast(v, _compute_dtype(m.dtype, x)))
                for x, a, b, v, m in zip(xs, t1, t2, _per_tensor(scalars, len(xs)), meta)]

    return lowering


lower(aten._foreach_addcmul.Scalar, aten._foreach_addcmul.ScalarList,
      aten._foreach_addcmul.Tensor)(_pointwise(aten.addcmul.default))
lower(aten._foreach_addcdiv.Scalar, aten._foreach_addcdiv.ScalarList,
      aten._foreach_addcdiv.Tensor)(_pointwise(aten.addcdiv.default))


@lower(aten._foreach_mm.default)
def foreach_mm(xs, ys, *, meta):
    return [_apply(aten.mm.default, m, x, y) for x, y, m in zip(xs, ys, meta)]


# ----------------------------------------------------------- copies and fills
@lower(aten._foreach_zero.default)
def foreach_zero(xs):
    return [jnp.zeros_like(x) for x in xs]


@lower(aten._foreach_copy.default)
def foreach_copy(xs, srcs, non_blocking=False):
    return [jnp.broadcast_to(s, x.shape).astype(x.dtype) for x, s in zip(xs, srcs)]


# ----------------------------------------------------------------- reductions
@lower(aten._foreach_norm.Scalar, static=("ord",))
def foreach_norm(xs, ord=2, dtype=None):
    low = registry.get(aten.linalg_vector_norm.default).fn
    out = []
    for x in xs:
        if x.dtype in _TORCH_NAMES:
            raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor "
                               f"as input. Got {_TORCH_NAMES[x.dtype]}")
        if dtype is None and x.dtype in _HALF:
            x = x.astype(jnp.float32)  # PyTorch accumulates half norms in float
        out.append(low(x, ord, None, False, dtype=dtype))
    return out


@lower(aten._foreach_powsum.Scalar, static=("ord",))
def foreach_powsum(xs, ord=2, dtype=None, *, meta):
    out = []
    for x, m in zip(xs, meta):
        a = jnp.abs(x.astype(_compute_dtype(m.dtype, x)))
        out.append(jnp.sum(a if ord == 1 else a * a if ord == 2 else a ** ord))
    return out


@lower(aten._foreach_max.default)
def foreach_max(xs, *, meta):
    return [_apply(aten.max.default, m, x) for x, m in zip(xs, meta)]


# ------------------------------------------------------------ fused optimizers
def _lr(lr):
    """The learning rate: a Python float, or a one-element tensor (the tensor_lr overloads)."""
    return lr.reshape(()) if hasattr(lr, "reshape") else lr


def _unscale(grad, grad_scale):
    return grad if grad_scale is None else grad / grad_scale.astype(grad.dtype)


def _skipped(found_inf):
    return None if found_inf is None else found_inf.reshape(()) == 1.0


def _keep_if(skip, new, old):
    """`new`, or `old` where the step is skipped (GradScaler found an inf)."""
    return new if skip is None else jnp.where(skip, old, new)


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, adamw):
    lr = _lr(lr)
    skip = _skipped(found_inf)
    outs = ([], [], [], [], [])
    for i, (p0, g0, m0, v0, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs,
                                                     steps)):
        ct = _compute_dtype(p0.dtype)
        p, g, m, v = (t.astype(ct) for t in (p0, g0, m0, v0))
        g = _unscale(g, grad_scale)
        g_stored = g
        if maximize:
            g = -g
        if weight_decay != 0:
            if adamw:
                p = p * jnp.asarray(1 - lr * weight_decay, ct)
            else:
                g = g + p * jnp.asarray(weight_decay, ct)
        # exp_avg.lerp_(grad, 1 - beta1), in lerp's two-sided form.
        w = jnp.asarray(1 - beta1, ct)
        m = m + w * (g - m) if abs(1 - beta1) < 0.5 else g - (g - m) * (1 - w)
        v = v * jnp.asarray(beta2, ct) + jnp.asarray(1 - beta2, ct) * g * g
        s = step.astype(jnp.float32).astype(jnp.float64)
        bias1 = 1 - jnp.power(jnp.float64(beta1), s)
        bias2_sqrt = jnp.sqrt(1 - jnp.power(jnp.float64(beta2), s))
        step_size = (jnp.asarray(lr, jnp.float64) / bias1).astype(ct)
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i].astype(ct), v)
            outs[4].append(_keep_if(skip, vmax, max_exp_avg_sqs[i]))
        else:
            vmax = v
        denom = jnp.sqrt(vmax) / bias2_sqrt.astype(ct) + jnp.asarray(eps, ct)
        p = p - step_size * m / denom
        for out, new, old in zip(outs, (p, g_stored, m, v), (p0, g0, m0, v0)):
            out.append(_keep_if(skip, new, old))
    return outs


@lower(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, dynamic=("lr",))
def fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
               beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
               found_inf=None):
    return _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                 beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf,
                 adamw=False)


@lower(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, dynamic=("lr",))
def fused_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
                beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
                found_inf=None):
    return _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                 beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf,
                 adamw=True)


@lower(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, dynamic=("lr",))
def fused_sgd(params, grads, momentum_buffers, *, weight_decay, momentum, lr, dampening,
              nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    lr = _lr(lr)
    skip = _skipped(found_inf)
    outs = ([], [], [])
    for i, (p0, g0) in enumerate(zip(params, grads)):
        ct = _compute_dtype(p0.dtype)
        p, g = p0.astype(ct), _unscale(g0.astype(ct), grad_scale)
        outs[1].append(_keep_if(skip, g, g0))
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + jnp.asarray(weight_decay, ct) * p
        if momentum != 0:
            b0 = momentum_buffers[i]
            buf = g if is_first_step else \
                jnp.asarray(momentum, ct) * b0.astype(ct) + jnp.asarray(1 - dampening, ct) * g
            outs[2].append(_keep_if(skip, buf, b0))
            g = g + jnp.asarray(momentum, ct) * buf if nesterov else buf
        p = p - jnp.asarray(lr, ct) * g
        outs[0].append(_keep_if(skip, p, p0))
    return outs


def _adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize,
             grad_scale, found_inf):
    skip = _skipped(found_inf)
    outs = ([], [], [])
    for p0, g0, s0, step in zip(params, grads, state_sums, state_steps):
        ct = _compute_dtype(p0.dtype)
        p, g, s = p0.astype(ct), _unscale(g0.astype(ct), grad_scale), s0.astype(ct)
        outs[1].append(_keep_if(skip, g, g0))
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + p * jnp.asarray(weight_decay, ct)
        clr = jnp.asarray(lr, jnp.float64) / (
            1 + (step.astype(jnp.float32).astype(jnp.float64) - 1) * lr_decay)
        s = s + g * g
        p = p - clr.astype(ct) * g / (jnp.sqrt(s) + jnp.asarray(eps, ct))
        outs[0].append(_keep_if(skip, p, p0))
        outs[2].append(_keep_if(skip, s, s0))
    return outs


@lower(aten._fused_adagrad_.default, dynamic=("lr",))
def fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                  maximize, grad_scale=None, found_inf=None):
    # This overload declares state_steps mutated (the kernel leaves them as they are).
    return (*_adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps,
                      maximize, grad_scale, found_inf), state_steps)


@lower(aten._fused_adagrad_.tensor_lr)
def fused_adagrad_tensor_lr(params, grads, state_sums, state_steps, *, lr, lr_decay,
                            weight_decay, eps, maximize, grad_scale=None, found_inf=None):
    return _adagrad(params, grads, state_sums, state_steps, _lr(lr), lr_decay,
                    weight_decay, eps, maximize, grad_scale, found_inf)


# ------------------------------------------------------ GradScaler (torch.amp)
@lower(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """grads * inv_scale; found_inf set to 1 if any grad held an inf or NaN (else kept)."""
    bad = jnp.zeros((), jnp.bool_)
    out = []
    for g in grads:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        ct = _compute_dtype(g.dtype)
        out.append(g.astype(ct) * inv_scale.astype(ct).reshape(()))
    return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale_.default)
def amp_update_scale(scale, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    """GradScaler's update: back off after an inf, grow after growth_interval clean steps."""
    inf = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (scale.astype(jnp.float64) * scale_growth_factor).astype(scale.dtype)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    backed = (scale.astype(jnp.float64) * scale_backoff_factor).astype(scale.dtype)
    new_scale = jnp.where(inf, backed, jnp.where(grow, grown, scale))
    new_tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker


def _register_missing_meta() -> None:
    """PyTorch lacks meta kernels for some fused optimizer steps (SGD, Adagrad, the tensor_lr
    overloads); the executor needs one. They only mutate their arguments: nothing to make."""
    lib = torch.library.Library("aten", "IMPL", "Meta")
    for name in ("_fused_sgd_", "_fused_sgd_.tensor_lr", "_fused_adagrad_",
                 "_fused_adagrad_.tensor_lr", "_fused_adam_.tensor_lr",
                 "_fused_adamw_.tensor_lr"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, lambda *args, **kwargs: None)
    _meta_libs.append(lib)


_meta_libs: list = []
_register_missing_meta()
