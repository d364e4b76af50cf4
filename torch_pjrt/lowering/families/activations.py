"""Activation functions and their backward ops, with PyTorch's CPU formulas.

The formulas follow PyTorch's kernels term by term (e.g. `hardsigmoid` is
`clamp(x + 3, 0, 6) / 6`, not `clamp(x / 6 + 0.5, 0, 1)`), so results agree to
the last bit where the arithmetic allows, and NaN goes where PyTorch sends it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from ...runtime import cpu_kernels
from ..registry import lower
from ._ops import aten, const, zero


@lower(aten.relu.default, promote="default")
def relu(x):
    return jnp.maximum(x, zero(x))  # NaN stays NaN


@lower(aten.gelu.default, promote="default")
def gelu(x, *, approximate="none"):
    if approximate == "none" and cpu_kernels.gelu_applies(x):
        return cpu_kernels.gelu(x, approximate)
    if approximate == "tanh":
        inner = const(math.sqrt(2 / math.pi), x) * (x + const(0.044715, x) * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * _normal_cdf(x)


def _normal_cdf(x):
    """Phi(x) as erfc(-x / sqrt 2) / 2: the form 1 + erf(x / sqrt 2) cancels to 0 below
    x = -5.5 in float32 (gelu(-5.7) was -0 where its value is -1.1e-7), erfc does not."""
    return 0.5 * jsp.erfc(-x * const(math.sqrt(0.5), x))


@lower(aten.gelu_backward.default, promote="default")
def gelu_backward(grad, x, *, approximate="none"):
    if approximate == "none" and cpu_kernels.gelu_applies(grad, x):
        return cpu_kernels.gelu_backward(grad, x, approximate)
    if approximate == "tanh":
        beta, kappa = const(math.sqrt(2 / math.pi), x), const(0.044715, x)
        t = jnp.tanh(beta * (x + kappa * x * x * x))
        left_derivative = 0.5 * (1 + t)
        right_derivative = 0.5 * x * (1 - t * t) * beta * (1 + 3 * kappa * x * x)
        return grad * (left_derivative + right_derivative)
    cdf = _normal_cdf(x)
    pdf = jnp.exp(-0.5 * x * x) * const(1 / math.sqrt(2 * math.pi), x)
    return grad * (cdf + x * pdf)


@lower(aten.silu.default, promote="default")
def silu(x):
    return x / (1 + jnp.exp(-x))


@lower(aten.silu_backward.default, promote="default")
def silu_backward(grad, x):
    s = 1 / (1 + jnp.exp(-x))
    return grad * s * (1 + x * (1 - s))


@lower(aten.mish.default, promote="default")
def mish(x):
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@lower(aten.sigmoid_backward.default, promote="default")
def sigmoid_backward(grad, y):
    return grad * jnp.conj((1 - y) * y)


@lower(aten.tanh_backward.default, promote="default")
def tanh_backward(grad, y):
    return grad * jnp.conj(1 - y * y)


# The threshold and the value are the input's dtype, as in ATen's kernel: compared and
# chosen in a float type, an int64 input above 2**24 came back rounded (2**31 - 1 as 2**31).
@lower(aten.threshold.default, promote="default", operands=("self",))
def threshold(x, threshold, value):
    return jnp.where(x <= jnp.asarray(threshold).astype(x.dtype),
                     jnp.asarray(value).astype(x.dtype), x)


@lower(aten.threshold_backward.default, promote="default", operands=("grad_output", "self"))
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= jnp.asarray(threshold).astype(x.dtype), zero(grad), grad)


@lower(aten.leaky_relu.default, promote="default")
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward.default, promote="default",
       operands=("grad_output", "self", "negative_slope"))
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.rrelu_with_noise.default, promote="default", operands=("self", "lower", "upper"),
       random=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, *, key):
    """Returns (the new noise, the output): noise is written in training mode only."""
    if not training:
        slope = (const(lower, x) + const(upper, x)) / 2
        return noise, jnp.where(x > 0, x, x * slope)
    r = jax.random.uniform(key, x.shape, x.dtype, const(lower, x), const(upper, x))
    negative = x <= 0
    return jnp.where(negative, r, 1).astype(noise.dtype), jnp.where(negative, x * r, x)


@lower(aten.elu.default, promote="default")
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x <= 0, jnp.expm1(x * input_scale) * (alpha * scale), x * scale)


@lower(aten.elu_backward.default, promote="default",
       operands=("grad_output", "alpha", "scale", "input_scale", "self_or_result"))
def elu_backward(grad, alpha, scale, input_scale, is_result, y):
    negcoef = alpha * scale
    if is_result:
        negative = grad * input_scale * (y + negcoef)
    else:
        negative = grad * input_scale * negcoef * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, grad * scale)


@lower(aten.hardtanh.default, promote="default")
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, min_val), max_val)


@lower(aten.hardtanh_backward.default, promote="default",
       operands=("grad_output", "self", "min_val", "max_val"))
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), zero(grad), grad)


@lower(aten.softplus.default, promote="default")
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lower(aten.softplus_backward.default, promote="default",
       operands=("grad_output", "self", "beta", "threshold"))
def softplus_backward(grad, x, beta, threshold):
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lower(aten.hardsigmoid.default, promote="default")
def hardsigmoid(x):
    return jnp.minimum(jnp.maximum(x + 3, zero(x)), const(6, x)) / 6


@lower(aten.hardsigmoid_backward.default, promote="default")
def hardsigmoid_backward(grad, x):
    # The CPU kernel's 1/6 is a float literal, also for float64.
    sixth = const(float(np.float32(1 / 6)), grad)
    return jnp.where((x > -3) & (x < 3), grad * sixth, zero(grad))


@lower(aten.hardswish.default, promote="default")
def hardswish(x):
    return x * jnp.minimum(jnp.maximum(x + 3, zero(x)), const(6, x)) / 6


@lower(aten.hardswish_backward.default, promote="default")
def hardswish_backward(grad, x):
    return jnp.where(x <= -3, zero(grad), jnp.where(x < 3, grad * (x / 3 + 0.5), grad))


@lower(aten.hardshrink.default, promote="default")
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), zero(x), x)


@lower(aten.hardshrink_backward.default, aten.softshrink_backward.default, promote="default")
def shrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), zero(grad), grad)


@lower(aten.softshrink.default, promote="default")
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@lower(aten.log_sigmoid_forward.default, promote="default")
def log_sigmoid_forward(x):
    """(output, buffer): PyTorch's CPU kernel keeps exp(-|x|) as the buffer."""
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, zero(x)) - jnp.log1p(z), z


@lower(aten.log_sigmoid_backward.default, promote="default",
       operands=("grad_output", "self"))
def log_sigmoid_backward(grad, x, buffer):
    # The buffer is empty when the forward ran elsewhere (CUDA): recompute it.
    z = jnp.exp(-jnp.abs(x))
    negative = x < 0
    max_deriv = jnp.where(negative, 1, 0).astype(x.dtype)
    sign = jnp.where(negative, 1, -1).astype(x.dtype)
    return grad * (max_deriv - sign * (z / (1 + z)))


def _halves(x, dim):
    n = x.shape[dim] // 2
    return jnp.split(x, [n], axis=dim)


@lower(aten.glu.default, promote="default")
def glu(x, dim=-1):
    a, b = _halves(x, dim)
    return a * (1 / (1 + jnp.exp(-b)))


@lower(aten.glu_backward.default, promote="default")
def glu_backward(grad, x, dim):
    a, b = _halves(x, dim)
    s = 1 / (1 + jnp.exp(-b))
    return jnp.concatenate([grad * s, grad * a * s * (1 - s)], axis=dim)


@lower(aten._prelu_kernel.default, promote="default")
def prelu(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lower(aten._prelu_kernel_backward.default, promote="default")
def prelu_backward(grad, x, weight):
    positive = x > 0
    return jnp.where(positive, grad, weight * grad), jnp.where(positive, zero(x), x * grad)
