"""Elementwise math: unary, binary and ternary ops, comparisons, activations.

Operands arrive already promoted to PyTorch's computation dtype (the `promote=`
kind of each registration); the machinery casts the result to the output dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from ..registry import lower
from ._ops import aten, register_each

# --------------------------------------------------------------------- unary
# op -> (JAX function, promotion kind)
UNARY = {
    aten.abs.default: (jnp.abs, "complex_to_float"),
    aten.neg.default: (jnp.negative, "default"),
    aten.sign.default: (jnp.sign, "default"),
    aten.sgn.default: (jnp.sign, "default"),
    aten.ceil.default: (jnp.ceil, "default"),
    aten.floor.default: (jnp.floor, "default"),
    aten.trunc.default: (jnp.trunc, "default"),
    aten.bitwise_not.default: (jnp.invert, "default"),
    aten.logical_not.default: (jnp.logical_not, "always_bool"),
    aten.exp.default: (jnp.exp, "int_to_float"),
    aten.exp2.default: (jnp.exp2, "int_to_float"),
    aten.expm1.default: (jnp.expm1, "int_to_float"),
    aten.log.default: (jnp.log, "int_to_float"),
    aten.log2.default: (jnp.log2, "int_to_float"),
    aten.log10.default: (jnp.log10, "int_to_float"),
    aten.log1p.default: (jnp.log1p, "int_to_float"),
    aten.sqrt.default: (jnp.sqrt, "int_to_float"),
    aten.rsqrt.default: (lax.rsqrt, "int_to_float"),
    aten.sin.default: (jnp.sin, "int_to_float"),
    aten.cos.default: (jnp.cos, "int_to_float"),
    aten.tan.default: (jnp.tan, "int_to_float"),
    aten.asin.default: (jnp.arcsin, "int_to_float"),
    aten.acos.default: (jnp.arccos, "int_to_float"),
    aten.atan.default: (jnp.arctan, "int_to_float"),
    aten.sinh.default: (jnp.sinh, "int_to_float"),
    aten.cosh.default: (jnp.cosh, "int_to_float"),
    aten.tanh.default: (jnp.tanh, "int_to_float"),
    aten.asinh.default: (jnp.arcsinh, "int_to_float"),
    aten.acosh.default: (jnp.arccosh, "int_to_float"),
    aten.atanh.default: (jnp.arctanh, "int_to_float"),
    aten.erf.default: (jsp.erf, "int_to_float"),
    aten.erfc.default: (jsp.erfc, "int_to_float"),
    aten.erfinv.default: (jsp.erfinv, "int_to_float"),
    aten.sigmoid.default: (jax.nn.sigmoid, "int_to_float"),
    aten.reciprocal.default: (jnp.reciprocal, "int_to_float"),
    aten.lgamma.default: (jsp.gammaln, "int_to_float"),
    aten.digamma.default: (jsp.digamma, "int_to_float"),
    aten.i0.default: (jnp.i0, "int_to_float"),
    aten.relu.default: (jax.nn.relu, "default"),
    aten.isnan.default: (jnp.isnan, "always_bool"),
    aten.isinf.default: (jnp.isinf, "always_bool"),
    aten.isposinf.default: (jnp.isposinf, "always_bool"),
    aten.isneginf.default: (jnp.isneginf, "always_bool"),
    aten.signbit.default: (jnp.signbit, "always_bool"),
    aten.conj_physical.default: (jnp.conj, "default"),
    aten.angle.default: (jnp.angle, "int_to_float"),
}
register_each(UNARY)


@lower(aten.frac.default, promote="default")
def frac(x):
    return x - jnp.trunc(x)


@lower(aten.round.default, promote="default")
def round_(x):
    return jnp.round(x)


@lower(aten.round.decimals, promote="default")
def round_decimals(x, *, decimals):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


# -------------------------------------------------------------------- binary
BINARY = {
    aten.mul.Tensor: (jnp.multiply, "default"),
    aten.mul.Scalar: (jnp.multiply, "default"),
    aten.div.Tensor: (jnp.true_divide, "int_to_float"),
    aten.div.Scalar: (jnp.true_divide, "int_to_float"),
    aten.remainder.Tensor: (jnp.remainder, "default"),
    aten.remainder.Scalar: (jnp.remainder, "default"),
    aten.remainder.Scalar_Tensor: (jnp.remainder, "default"),
    aten.fmod.Tensor: (jnp.fmod, "default"),
    aten.fmod.Scalar: (jnp.fmod, "default"),
    aten.maximum.default: (jnp.maximum, "default"),
    aten.minimum.default: (jnp.minimum, "default"),
    aten.fmax.default: (jnp.fmax, "default"),
    aten.fmin.default: (jnp.fmin, "default"),
    aten.atan2.default: (jnp.arctan2, "int_to_float"),
    aten.hypot.default: (jnp.hypot, "default"),
    aten.copysign.Tensor: (jnp.copysign, "int_to_float"),
    aten.copysign.Scalar: (jnp.copysign, "int_to_float"),
    aten.nextafter.default: (jnp.nextafter, "default"),
    aten.bitwise_and.Tensor: (jnp.bitwise_and, "default"),
    aten.bitwise_and.Scalar: (jnp.bitwise_and, "default"),
    aten.bitwise_or.Tensor: (jnp.bitwise_or, "default"),
    aten.bitwise_or.Scalar: (jnp.bitwise_or, "default"),
    aten.bitwise_xor.Tensor: (jnp.bitwise_xor, "default"),
    aten.bitwise_xor.Scalar: (jnp.bitwise_xor, "default"),
    aten.bitwise_left_shift.Tensor: (jnp.left_shift, "default"),
    aten.bitwise_right_shift.Tensor: (jnp.right_shift, "default"),
    aten.logical_and.default: (jnp.logical_and, "always_bool"),
    aten.logical_or.default: (jnp.logical_or, "always_bool"),
    aten.logical_xor.default: (jnp.logical_xor, "always_bool"),
    aten.eq.Tensor: (jnp.equal, "always_bool"),
    aten.eq.Scalar: (jnp.equal, "always_bool"),
    aten.ne.Tensor: (jnp.not_equal, "always_bool"),
    aten.ne.Scalar: (jnp.not_equal, "always_bool"),
    aten.lt.Tensor: (jnp.less, "always_bool"),
    aten.lt.Scalar: (jnp.less, "always_bool"),
    aten.le.Tensor: (jnp.less_equal, "always_bool"),
    aten.le.Scalar: (jnp.less_equal, "always_bool"),
    aten.gt.Tensor: (jnp.greater, "always_bool"),
    aten.gt.Scalar: (jnp.greater, "always_bool"),
    aten.ge.Tensor: (jnp.greater_equal, "always_bool"),
    aten.ge.Scalar: (jnp.greater_equal, "always_bool"),
    aten.xlogy.Tensor: (jsp.xlogy, "int_to_float"),
}
register_each(BINARY)


@lower(aten.add.Tensor, aten.add.Scalar, promote="default")
def add(x, y, alpha=1):
    return x + alpha * y


@lower(aten.sub.Tensor, aten.sub.Scalar, promote="default")
def sub(x, y, alpha=1):
    return x - alpha * y


@lower(aten.rsub.Tensor, aten.rsub.Scalar, promote="default")
def rsub(x, y, alpha=1):
    return y - alpha * x


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode, promote="default", static=("rounding_mode",))
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(x, y)
    integer = jnp.issubdtype(x.dtype, jnp.integer)
    if rounding_mode == "trunc":
        return lax.div(x, y) if integer else jnp.trunc(x / y)
    return jnp.floor_divide(x, y)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar, promote="default")
def floor_divide(x, y):
    return jnp.floor_divide(x, y)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar, promote="default")
def pow_(x, y):
    return jnp.power(x, y)


# ------------------------------------------------------------------- ternary
@lower(aten.where.self, promote="default", operands=("self", "other"))
def where(condition, x, y):
    return jnp.where(condition, x, y)


@lower(aten.clamp.default, aten.clamp.Tensor, promote="default")
def clamp(x, min=None, max=None):
    if min is not None:
        x = jnp.maximum(x, min)
    if max is not None:
        x = jnp.minimum(x, max)
    return x


@lower(aten.clamp_min.default, aten.clamp_min.Tensor, promote="default")
def clamp_min(x, min):
    return jnp.maximum(x, min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor, promote="default")
def clamp_max(x, max):
    return jnp.minimum(x, max)


@lower(aten.addcmul.default, promote="default")
def addcmul(x, t1, t2, *, value=1):
    return x + value * t1 * t2


@lower(aten.addcdiv.default, promote="default")
def addcdiv(x, t1, t2, *, value=1):
    return x + value * (t1 / t2)


@lower(aten.lerp.Scalar, aten.lerp.Tensor, promote="default")
def lerp(start, end, weight):
    # PyTorch's formula: exact at both ends.
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor, promote="result",
       operands=("self", "value"))
def masked_fill(x, mask, value):
    return jnp.where(mask, value, x)


# --------------------------------------------------------------- activations
@lower(aten.gelu.default, promote="default", static=())
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lower(aten.gelu_backward.default, promote="default")
def gelu_backward(grad, x, *, approximate="none"):
    if approximate == "tanh":
        k = jnp.sqrt(2.0 / jnp.pi).astype(x.dtype)
        inner = k * (x + 0.044715 * x**3)
        t = jnp.tanh(inner)
        dinner = k * (1 + 3 * 0.044715 * x**2)
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * dinner)
    cdf = 0.5 * (1 + jsp.erf(x / jnp.sqrt(2.0).astype(x.dtype)))
    pdf = jnp.exp(-0.5 * x * x) / jnp.sqrt(2 * jnp.pi).astype(x.dtype)
    return grad * (cdf + x * pdf)


@lower(aten.silu.default, promote="default")
def silu(x):
    return jax.nn.silu(x)


@lower(aten.silu_backward.default, promote="default")
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lower(aten.sigmoid_backward.default, promote="default")
def sigmoid_backward(grad, y):
    return grad * y * (1 - y)


@lower(aten.tanh_backward.default, promote="default")
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lower(aten.threshold_backward.default, promote="default", operands=("grad_output", "self"))
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lower(aten.threshold.default, promote="default")
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, value, x)


@lower(aten.leaky_relu.default, promote="default")
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward.default, promote="default",
       operands=("grad_output", "self", "negative_slope"))
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.elu.default, promote="default")
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(aten.hardtanh.default, promote="default")
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, min_val, max_val)


@lower(aten.hardtanh_backward.default, promote="default",
       operands=("grad_output", "self", "min_val", "max_val"))
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lower(aten.softplus.default, promote="default")
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lower(aten.hardsigmoid.default, promote="default")
def hardsigmoid(x):
    return jnp.clip(x / 6 + 0.5, 0, 1)


@lower(aten.hardswish.default, promote="default")
def hardswish(x):
    return x * jnp.clip(x / 6 + 0.5, 0, 1)


@lower(aten.mish.default, promote="default")
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))
