"""Elementwise math: unary, binary and ternary ops, comparisons, bitwise ops.

Operands arrive already promoted to PyTorch's computation dtype (the `promote=`
kind of each registration); the machinery casts the result to the output dtype.
Where PyTorch's CPU kernel defines an edge case differently from XLA (integer
division by zero, negative integer powers, NaN in `sign`, -0.0 in `angle`), the
lowering spells out PyTorch's rule.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from .. import checks
from ..registry import lower
from ._ops import aten, is_complex, is_int, register_each, zero


# --------------------------------------------------------------------- unary
def _real_only(fn, name: str):
    """`fn` raising the CPU's NotImplementedError on a complex input (JAX raises a
    TypeError, which `except RuntimeError` would not catch)."""

    def real(x):
        if is_complex(x):
            raise NotImplementedError(f"{name} is not supported for complex inputs")
        return fn(x)

    return real


def _branch_cut(fn, odd: bool = False):
    """`fn` on complex inputs with C99's signed-zero branch cuts (PyTorch's CPU): XLA's
    complex sqrt, log1p and inverse trigonometric functions ignore the sign of a zero real
    or imaginary part, so sqrt(-1 - 0j) came out +1j where the CPU gives -1j. These
    functions are conjugate-symmetric, f(conj z) = conj f(z), and `odd` ones also satisfy
    f(-z) = -f(z): computed at |re| + i|im| (where XLA is right), they take the signs back
    from the input's sign bits."""

    def cut(x):
        if not is_complex(x):
            return fn(x)
        re, im = x.real, x.imag
        w = fn(lax.complex(jnp.abs(re) if odd else re, jnp.abs(im)))
        wr, wi = w.real, w.imag
        if odd:  # the first quadrant maps into itself: its zeros are +0 (XLA gave -0)
            wr, wi = jnp.abs(wr), jnp.abs(wi)
            wr = jnp.where(jnp.signbit(re), -wr, wr)
        return lax.complex(wr, jnp.where(jnp.signbit(im), -wi, wi))

    return cut


# op -> (JAX function, promotion kind)
UNARY = {
    aten.neg.default: (jnp.negative, "default"),
    aten.ceil.default: (_real_only(jnp.ceil, "ceil"), "default"),
    aten.floor.default: (_real_only(jnp.floor, "floor"), "default"),
    aten.trunc.default: (_real_only(jnp.trunc, "trunc"), "default"),
    aten.bitwise_not.default: (jnp.invert, "default"),
    aten.logical_not.default: (jnp.logical_not, "always_bool"),
    aten.expm1.default: (jnp.expm1, "int_to_float"),
    aten.log.default: (jnp.log, "int_to_float"),
    aten.log2.default: (jnp.log2, "int_to_float"),
    aten.log10.default: (jnp.log10, "int_to_float"),
    aten.log1p.default: (_branch_cut(jnp.log1p), "int_to_float"),
    aten.sqrt.default: (_branch_cut(jnp.sqrt), "int_to_float"),
    aten.rsqrt.default: (lax.rsqrt, "int_to_float"),
    aten.sin.default: (jnp.sin, "int_to_float"),
    aten.cos.default: (jnp.cos, "int_to_float"),
    aten.tan.default: (jnp.tan, "int_to_float"),
    aten.asin.default: (_branch_cut(jnp.arcsin, odd=True), "int_to_float"),
    aten.acos.default: (_branch_cut(jnp.arccos), "int_to_float"),
    aten.atan.default: (_branch_cut(jnp.arctan, odd=True), "int_to_float"),
    aten.sinh.default: (jnp.sinh, "int_to_float"),
    aten.cosh.default: (jnp.cosh, "int_to_float"),
    aten.tanh.default: (jnp.tanh, "int_to_float"),
    aten.asinh.default: (_branch_cut(jnp.arcsinh, odd=True), "int_to_float"),
    aten.acosh.default: (_branch_cut(jnp.arccosh), "int_to_float"),
    aten.atanh.default: (_branch_cut(jnp.arctanh, odd=True), "int_to_float"),
    aten.erf.default: (jsp.erf, "int_to_float"),
    aten.erfc.default: (jsp.erfc, "int_to_float"),
    aten.reciprocal.default: (jnp.reciprocal, "int_to_float"),
    aten.lgamma.default: (jsp.gammaln, "int_to_float"),
    aten.i0.default: (jnp.i0, "int_to_float"),
    aten.isnan.default: (jnp.isnan, "always_bool"),
    aten.isinf.default: (jnp.isinf, "always_bool"),
    aten.isposinf.default: (jnp.isposinf, "always_bool"),
    aten.isneginf.default: (jnp.isneginf, "always_bool"),
    aten.signbit.default: (jnp.signbit, "always_bool"),
    aten._conj_physical.default: (jnp.conj, "default"),
}
register_each(UNARY)


@lower(aten.abs.default, promote="complex_to_float")
def abs_(x):
    if not is_complex(x):
        return jnp.abs(x)
    # C99: |z| is +inf when either part is infinite, even if the other is NaN.
    inf = jnp.isinf(x.real) | jnp.isinf(x.imag)
    return jnp.where(inf, jnp.inf, jnp.abs(x))


@lower(aten.exp.default, promote="int_to_float")
def exp(x):
    if not is_complex(x):
        return jnp.exp(x)
    # C99 special values the XLA formula gets wrong: exp(-inf + iy) is 0 for any
    # y, and exp(x + 0i) stays real for any x.
    re, im = x.real, x.imag
    out = jnp.exp(x)
    out = jnp.where(im == 0, lax.complex(jnp.exp(re), im), out)
    zero = lax.complex(jnp.zeros_like(re), jnp.zeros_like(im))
    return jnp.where(jnp.isneginf(re) & ~jnp.isfinite(im), zero, out)


@lower(aten.exp2.default, promote="int_to_float")
def exp2(x):
    if is_complex(x):
        return jnp.exp2(x)
    # jnp.exp2 is exp(x * ln 2), whose product rounds worse as |x| grows (float32 off by
    # 3.6e-6 relative at x = 99, and by up to 100% near the bottom of the range; PyTorch's
    # kernel is within an ulp): 2**x = ldexp(2**f, n) with n = round(x), exact scaling,
    # and f in [-0.5, 0.5] keeps exp's argument small.
    n = jnp.round(x)
    frac = jnp.exp((x - n) * jnp.asarray(math.log(2), x.dtype))
    out = jnp.ldexp(frac, jnp.clip(n, -2200, 2200).astype(jnp.int32))
    return jnp.where(jnp.isfinite(x), out, jnp.exp2(x))  # inf, -inf, NaN


@lower(aten.sigmoid.default, promote="int_to_float")
def sigmoid(x):
    return 1 / (1 + jnp.exp(-x))


def _real_sign(x):
    """PyTorch's sign of a real number: (0 < x) - (x < 0), so NaN and -0.0 give 0."""
    if x.dtype == jnp.bool_:
        return x
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lower(aten.sign.default, promote="default")
def sign(x):
    return _real_sign(x)


@lower(aten.sgn.default, promote="default")
def sgn(x):
    if not is_complex(x):
        return _real_sign(x)
    r = jnp.abs(x)
    nan = jnp.full((), complex(math.nan, math.nan), x.dtype)
    safe = jnp.where(r == 0, 1, r).astype(x.real.dtype)
    unit = x / safe
    return jnp.where(r == 0, zero(x), jnp.where(jnp.isfinite(r), unit, nan))


@lower(aten.angle.default, promote="int_to_float")
def angle(x):
    if is_complex(x):
        return jnp.arctan2(x.imag, x.real)
    pi = jnp.asarray(jnp.pi, x.dtype)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, pi, zero(x)))


@lower(aten.frac.default, promote="default")
def frac(x):
    return x - jnp.trunc(x)


@lower(aten.round.default, promote="default")
def round_(x):
    return jnp.round(x)  # half to even, as std::nearbyint


@lower(aten.round.decimals, promote="default")
def round_decimals(x, *, decimals):
    if is_int(x) or decimals == 0:
        return jnp.round(x)
    # PyTorch scales by a power of ten computed in the opmath type, and divides
    # (rather than multiplies by 10**decimals) for negative decimals.
    scale = jnp.asarray(10.0 ** abs(decimals), x.dtype)
    if decimals < 0:
        return jnp.round(x / scale) * scale
    return jnp.round(x * scale) / scale


@lower(aten.nan_to_num.default, promote="default")
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if is_int(x):
        return x
    if is_complex(x):
        return lax.complex(nan_to_num(x.real, nan, posinf, neginf),
                           nan_to_num(x.imag, nan, posinf, neginf))
    info = jnp.finfo(x.dtype)
    nan_v = jnp.asarray(0.0 if nan is None else nan, x.dtype)
    pos_v = jnp.asarray(info.max if posinf is None else posinf, x.dtype)
    neg_v = jnp.asarray(info.min if neginf is None else neginf, x.dtype)
    x = jnp.where(jnp.isnan(x), nan_v, x)
    return jnp.where(jnp.isposinf(x), pos_v, jnp.where(jnp.isneginf(x), neg_v, x))


@lower(aten.logit.default, promote="int_to_float")
def logit(x, eps=None):
    if eps is not None and eps >= 0:
        lo, hi = jnp.asarray(eps, x.dtype), 1 - jnp.asarray(eps, x.dtype)
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))  # NaN stays NaN
    return jnp.log(x / (1 - x))


@lower(aten.logit_backward.default, promote="int_to_float")
def logit_backward(grad, x, eps=None):
    inf = jnp.asarray(jnp.inf, x.dtype)
    grad_x = jnp.where((x == 0) | (x == 1), grad * inf, grad / (x * (1 - x)))
    if eps is None or eps < 0:
        return jnp.where((x < 0) | (x > 1), jnp.asarray(jnp.nan, x.dtype), grad_x)
    lo, hi = jnp.asarray(eps, x.dtype), 1 - jnp.asarray(eps, x.dtype)
    return jnp.where((x < lo) | (x > hi), zero(x), grad_x)


@lower(aten.sinc.default, promote="int_to_float")
def sinc(x):
    product = jnp.asarray(jnp.pi, x.dtype) * x
    safe = jnp.where(x == 0, jnp.ones((), x.dtype), product)
    return jnp.where(x == 0, jnp.ones((), x.dtype), jnp.sin(safe) / safe)


@lower(aten.frexp.Tensor)
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    finite = jnp.isfinite(x)
    return mantissa, jnp.where(finite, exponent, 0).astype(jnp.int32)


# -------------------------------------------------------------------- binary
_BITS = {2: (jnp.uint16, jnp.int32), 4: (jnp.uint32, jnp.int64), 8: (jnp.uint64, jnp.int64)}


def nextafter(x, y):
    """The next representable value after x towards y, stepped on the bits in the operands'
    own dtype: +1 or -1 on the magnitude, the smallest subnormal (with y's sign) from zero.
    jnp.nextafter stepped bfloat16 in float32 and rounded back (nextafter(1, 2) gave 1),
    and XLA:CPU's float comparisons take subnormals for zero, so the order is the bits' too."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.nextafter(x, y)
    x, y = jnp.broadcast_arrays(x, y)
    unsigned, wide = _BITS[x.dtype.itemsize]
    sign = unsigned(1 << (8 * x.dtype.itemsize - 1))
    bx, by = (lax.bitcast_convert_type(v, unsigned) for v in (x, y))
    mx, my = bx & ~sign, by & ~sign
    inf = lax.bitcast_convert_type(jnp.asarray(jnp.inf, x.dtype), unsigned)
    nan = (mx > inf) | (my > inf)

    def key(b, m):  # ordered as the values: -magnitude for a negative
        return jnp.where((b & sign) != 0, -m.astype(wide), m.astype(wide))

    kx, ky = key(bx, mx), key(by, my)
    away = (kx < ky) == (kx > 0)  # the magnitude grows
    stepped = jnp.where(away, bx + unsigned(1), bx - unsigned(1))
    tiny = (by & sign) | unsigned(1)
    out = jnp.where(mx == 0, tiny, stepped)
    out = jnp.where(kx == ky, by, out)
    out = lax.bitcast_convert_type(out, x.dtype)
    return jnp.where(nan, jnp.asarray(jnp.nan, x.dtype), out)


BINARY = {
    aten.mul.Tensor: (jnp.multiply, "default"),
    aten.mul.Scalar: (jnp.multiply, "default"),
    aten.div.Tensor: (jnp.true_divide, "int_to_float"),
    aten.div.Scalar: (jnp.true_divide, "int_to_float"),
    aten.maximum.default: (jnp.maximum, "default"),
    aten.minimum.default: (jnp.minimum, "default"),
    aten.fmax.default: (jnp.fmax, "default"),
    aten.fmin.default: (jnp.fmin, "default"),
    aten.atan2.default: (jnp.arctan2, "int_to_float"),
    aten.hypot.default: (jnp.hypot, "default"),
    aten.copysign.Tensor: (jnp.copysign, "int_to_float"),
    aten.copysign.Scalar: (jnp.copysign, "int_to_float"),
    aten.nextafter.default: (nextafter, "no_opmath"),  # steps in the operands' own dtype
    aten.bitwise_and.Tensor: (jnp.bitwise_and, "default"),
    aten.bitwise_and.Scalar: (jnp.bitwise_and, "default"),
    aten.bitwise_or.Tensor: (jnp.bitwise_or, "default"),
    aten.bitwise_or.Scalar: (jnp.bitwise_or, "default"),
    aten.bitwise_xor.Tensor: (jnp.bitwise_xor, "default"),
    aten.bitwise_xor.Scalar: (jnp.bitwise_xor, "default"),
    # XLA shifts match PyTorch: an amount outside [0, bits) gives 0 (left) or
    # the sign fill (right).
    aten.bitwise_left_shift.Tensor: (jnp.left_shift, "default"),
    aten.bitwise_right_shift.Tensor: (jnp.right_shift, "default"),
    aten.__lshift__.Tensor: (jnp.left_shift, "default"),
    aten.__lshift__.Scalar: (jnp.left_shift, "default"),
    aten.__rshift__.Tensor: (jnp.right_shift, "default"),
    aten.__rshift__.Scalar: (jnp.right_shift, "default"),
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
}
register_each(BINARY)


@lower(aten.add.Tensor, aten.add.Scalar, promote="default")
def add(x, y, alpha=1):
    if x.dtype == jnp.bool_:
        return x | (y & (alpha != 0))
    return x + alpha * y


@lower(aten._add_relu.Tensor, aten._add_relu.Scalar, promote="default")
def add_relu(x, y, alpha=1):
    out = x + alpha * y
    return jnp.where(out > 0, out, zero(out))


@lower(aten.sub.Tensor, aten.sub.Scalar, promote="default")
def sub(x, y, alpha=1):
    return x - alpha * y


@lower(aten.rsub.Tensor, aten.rsub.Scalar, promote="default")
def rsub(x, y, alpha=1):
    return y - alpha * x


def _nonzero_divisor(y) -> None:
    """Integer division by zero raises on the CPU: check it on the device."""
    checks.require(y != 0, RuntimeError, "ZeroDivisionError")


def _div_floor(x, y):
    """Floor division as PyTorch's CPU kernel: Python's rule for ints, fmod-based for floats."""
    if is_int(x):
        _nonzero_divisor(y)
        safe = jnp.where(y == 0, jnp.ones((), y.dtype), y)
        return jnp.floor_divide(x, safe)
    mod = lax.rem(*jnp.broadcast_arrays(x, y))
    div = (x - mod) / y
    div = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(zero(div), x / y), floordiv)
    return jnp.where(y == 0, x / y, floordiv)


def _div_trunc(x, y, dtype):
    """Truncated division as the CPU's kernel: for float16 and bfloat16 it rounds the
    quotient to the dtype before truncating (56672 / 31.3125 is 1809.97 in float32, 1810 in
    float16), except by a divisor of one element, which it divides by in float32 and
    truncates there."""
    if is_int(x):
        _nonzero_divisor(y)
        x, y = jnp.broadcast_arrays(x, jnp.where(y == 0, jnp.ones((), y.dtype), y))
        return lax.div(x, y)
    q = x / y
    return jnp.trunc(q if jnp.size(y) == 1 else q.astype(dtype))


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode, promote="default", static=("rounding_mode",))
def div_mode(x, y, *, rounding_mode=None, meta):
    if rounding_mode is None:
        return jnp.true_divide(x, y)
    if rounding_mode == "trunc":
        return _div_trunc(x, y, meta[0].dtype)
    return _div_floor(x, y)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar, promote="default")
def floor_divide(x, y):
    return _div_floor(x, y)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor,
       promote="default")
def remainder(x, y):
    """Python's modulo: the result takes the divisor's sign."""
    if is_int(x):
        _nonzero_divisor(y)
        y = jnp.where(y == 0, jnp.ones((), y.dtype), y)
    mod = lax.rem(*jnp.broadcast_arrays(x, y))
    return jnp.where((mod != 0) & ((y < 0) != (mod < 0)), mod + y, mod)


@lower(aten.fmod.Tensor, aten.fmod.Scalar, promote="default")
def fmod(x, y):
    """C's fmod: the result takes the dividend's sign."""
    if is_int(x):
        _nonzero_divisor(y)
        y = jnp.where(y == 0, jnp.ones((), y.dtype), y)
    return lax.rem(*jnp.broadcast_arrays(x, y))


def _int_pow(x, y):
    """x**y for integers, wrapping like C; negative exponents give 1/x rounded toward 0.
    Booleans: x**0 is True, x**y is x otherwise."""
    x, y = jnp.broadcast_arrays(x, y)
    if x.dtype == jnp.bool_:
        return jnp.where(y == 0, True, x)
    e = jnp.where(y < 0, 0, y)

    def step(_, state):
        result, base, e = state
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    one = jnp.ones_like(x)
    result, _, _ = lax.fori_loop(0, jnp.iinfo(x.dtype).bits, step, (one, x, e))
    if jnp.issubdtype(x.dtype, jnp.signedinteger):
        odd = (y & 1) == 1
        negative = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where(odd, -one, one), 0 * one))
        result = jnp.where(y < 0, negative, result)
    return result


def _power(x, y):
    """x**y for floating and complex x. A complex zero base follows the CPU kernel, which
    computes exp(y * log(x)) with C's rules for infinities: 0 where real(y) > 0, inf+nanj
    where real(y) < 0, NaN where real(y) == 0 (XLA gives NaN for 0**(1+2j), 1 for 0**0)."""
    out = jnp.power(x, y)
    if not is_complex(out):
        return out
    c = jnp.real(jnp.asarray(y))
    nan = jnp.array(jnp.nan, jnp.real(out).dtype)
    inf = jnp.array(jnp.inf, jnp.real(out).dtype)
    at_zero = lax.complex(jnp.where(c > 0, 0, jnp.where(c < 0, inf, nan)),
                          jnp.where(c > 0, 0, nan))
    return jnp.where(x == 0, at_zero.astype(out.dtype), out)


@lower(aten.pow.Tensor_Tensor, aten.pow.Scalar, promote="default")
def pow_(x, y):
    if is_int(x):
        return _int_pow(x, y)
    return _power(x, y)


@lower(aten.pow.Tensor_Scalar, promote="default")
def pow_tensor_scalar(x, exponent):
    if is_int(x):
        checks.require(exponent >= 0, RuntimeError,
                       "Integers to negative integer powers are not allowed.")
        return _int_pow(x, exponent)
    # PyTorch's kernel special-cases these exponents (sqrt(-inf) is NaN where
    # pow(-inf, 0.5) is inf; x*x is exact where a complex pow is not). The exponent is
    # a run-time value: a switch runs only the branch it selects. An exponent of 0 fills
    # ones (NaN**0 and complex 0**0 too).
    branches = (_power, lambda x, e: x * x, lambda x, e: x * x * x,
                lambda x, e: 1 / (x * x), lambda x, e: jnp.sqrt(x),
                lambda x, e: lax.rsqrt(x), lambda x, e: 1 / x, lambda x, e: jnp.ones_like(x))
    specials = (2, 3, -2, 0.5, -0.5, -1, 0)
    index = sum((exponent == v).astype(jnp.int32) * (i + 1) for i, v in enumerate(specials))
    return lax.switch(index, branches, x, exponent)


@lower(aten.xlogy.Tensor, promote="int_to_float")
def xlogy(x, y):
    out = jnp.where(x == 0, zero(x), x * jnp.log(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower(aten.special_xlog1py.default, promote="int_to_float")
def xlog1py(x, y):
    out = jnp.where(x == 0, zero(x), x * jnp.log1p(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower(aten.logaddexp.default, promote="default")
def logaddexp(x, y):
    if is_complex(x):
        big = jnp.where(x.real >= y.real, x, y)
        small = jnp.where(x.real >= y.real, y, x)
        return big + jnp.log1p(jnp.exp(small - big))
    m = jnp.maximum(x, y)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(x - y)))
    return jnp.where(jnp.isinf(x) & (x == y), x, out)


@lower(aten.logaddexp2.default, promote="default")
def logaddexp2(x, y):
    m = jnp.maximum(x, y)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(x - y))) * jnp.asarray(1 / math.log(2), x.dtype)
    return jnp.where(jnp.isinf(x) & (x == y), x, out)


@lower(aten.heaviside.default, promote="default")
def heaviside(x, values):
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


def _gcd(a, b):
    a, b = jnp.broadcast_arrays(jnp.abs(a), jnp.abs(b))

    def body(state):
        a, b = state
        nz = a != 0
        return jnp.where(nz, b % jnp.where(nz, a, 1), 0), jnp.where(nz, a, b)

    _, g = lax.while_loop(lambda s: jnp.any(s[0] != 0), body, (a, b))
    return g


@lower(aten.gcd.default, promote="default")
def gcd(x, y):
    return _gcd(x, y)


@lower(aten.lcm.default, promote="default")
def lcm(x, y):
    g = _gcd(x, y)
    return jnp.where(g == 0, zero(g), jnp.abs(x // jnp.where(g == 0, 1, g) * y))


@lower(aten.complex.default)
def complex_(real, imag, *, meta):
    # The CPU kernel's checks (PyTorch's meta kernel promotes instead); with out=, meta is
    # the out tensor.
    if real.dtype != imag.dtype:
        raise RuntimeError(f"Expected object of scalar type {checks.type_name(real.dtype)} but "
                           f"got scalar type {checks.type_name(imag.dtype)} for second argument")
    expected = {"float32": jnp.dtype("complex64"), "float64": jnp.dtype("complex128")}.get(
        str(real.dtype))
    if expected is not None and meta[0].dtype != expected:
        raise RuntimeError(f"Expected object of scalar type {checks.type_name(expected)} but "
                           f"got scalar type {checks.type_name(meta[0].dtype)} for argument "
                           "'out'")
    if real.dtype == jnp.float16:  # complex32, computed as complex64 (storage/dtypes.py)
        real, imag = real.astype(jnp.float32), imag.astype(jnp.float32)
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lower(aten.polar.default, promote="default")
def polar(magnitude, phase):
    return lax.complex(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))


def _isin(elements, test, invert):
    """Membership by binary search in the sorted test elements (no N x M compare)."""
    flat = jnp.sort(jnp.ravel(test))
    if flat.size == 0:
        found = jnp.zeros(jnp.shape(elements), bool)
    else:
        idx = jnp.clip(jnp.searchsorted(flat, elements), 0, flat.size - 1)
        found = flat[idx] == elements
    return ~found if invert else found


@lower(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor,
       promote="default")
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    return _isin(elements, test_elements, invert)


# ------------------------------------------------------------------- ternary
@lower(aten.where.self, promote="default", operands=("self", "other"))
def where(condition, x, y):
    return jnp.where(condition, x, y)


@lower(aten.clamp.default, aten.clamp.Tensor, promote="default")
def clamp(x, min=None, max=None):
    # NaN in x or in a bound gives NaN (jnp.maximum/minimum propagate it); with
    # min > max every element becomes max, as in PyTorch.
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
