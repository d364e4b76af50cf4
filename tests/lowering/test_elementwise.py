"""Elementwise ops, activations and special functions on pjrt against the CPU.

OpInfo samples (forward and backward, float32/float64/int64/bool/complex64 as the CPU
supports them), one tensor of edge values per op and dtype (NaN, +-inf, -0.0,
integer extremes), and PyTorch's integer rules (division by zero raises, negative
integer powers, shifts by the bit width). No op may fall back to the CPU.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, compare, to_device
from math_diff import check_opinfo, fallbacks, new_fallbacks, tolerance
from tolerance import assert_no_less_accurate, elementwise

NAN, INF = math.nan, math.inf

UNARY = (
    "abs", "acos", "acosh", "angle", "asin", "asinh", "atan", "atanh", "bitwise_not", "ceil",
    "conj_physical", "cos", "cosh", "deg2rad", "digamma", "erf", "erfc", "erfinv", "exp",
    "exp2", "expm1", "floor", "frac", "frexp", "i0", "isfinite", "isinf", "isnan", "isneginf",
    "isposinf", "isreal", "lgamma", "log", "log10", "log1p", "log2", "logical_not", "logit",
    "nan_to_num", "neg", "positive", "rad2deg", "reciprocal", "round", "round.decimals_0",
    "round.decimals_3", "round.decimals_neg_3", "rsqrt", "sgn", "sigmoid", "sign", "signbit",
    "sin", "sinc", "sinh", "sqrt", "square", "tan", "tanh", "trunc",
    "mvlgamma.mvlgamma_p_1", "mvlgamma.mvlgamma_p_3",
)
BINARY = (
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "div.trunc_rounding",
    "div.floor_rounding", "true_divide", "floor_divide", "remainder", "fmod", "pow",
    "float_power", "atan2", "hypot", "copysign", "nextafter", "maximum", "minimum", "fmax",
    "fmin", "max.binary", "min.binary", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift", "logical_and", "logical_or", "logical_xor",
    "eq", "ne", "lt", "le", "gt", "ge", "xlogy", "logaddexp", "logaddexp2", "heaviside",
    "gcd", "lcm", "ldexp", "isclose", "complex", "polar", "isin", "__rpow__", "__rmod__",
    "__radd__", "__rsub__", "__rmul__", "__rdiv__", "__rand__", "__ror__", "__rxor__",
    "special.xlog1py", "special.zeta", "igamma", "igammac",
)
TERNARY = ("where", "clamp", "clamp_min", "clamp_max", "addcmul", "addcdiv", "lerp",
           "masked_fill")
ACTIVATIONS = tuple("nn.functional." + n for n in (
    "relu", "relu6", "gelu", "silu", "silu.complex", "mish", "elu", "celu", "selu",
    "leaky_relu", "hardtanh", "hardsigmoid", "hardswish", "hardshrink", "softshrink",
    "softplus", "logsigmoid", "glu", "prelu", "threshold", "tanhshrink", "softsign",
))
SPECIAL = (
    "special.airy_ai", "special.bessel_j0", "special.bessel_j1", "special.bessel_y0",
    "special.bessel_y1", "special.modified_bessel_i0", "special.modified_bessel_i1",
    "special.modified_bessel_k0", "special.modified_bessel_k1",
    "special.scaled_modified_bessel_k0", "special.scaled_modified_bessel_k1",
    "special.spherical_bessel_j0", "special.entr", "special.erfcx", "special.i0e",
    "special.i1", "special.i1e", "special.log_ndtr", "special.ndtr", "special.ndtri",
    "polygamma.polygamma_n_0", "polygamma.polygamma_n_1", "polygamma.polygamma_n_2",
    "polygamma.polygamma_n_3", "polygamma.polygamma_n_4",
    "special.chebyshev_polynomial_t", "special.chebyshev_polynomial_u",
    "special.chebyshev_polynomial_v", "special.chebyshev_polynomial_w",
    "special.shifted_chebyshev_polynomial_t", "special.shifted_chebyshev_polynomial_u",
    "special.shifted_chebyshev_polynomial_v", "special.shifted_chebyshev_polynomial_w",
    "special.hermite_polynomial_h", "special.hermite_polynomial_he",
    "special.laguerre_polynomial_l", "special.legendre_polynomial_p",
)

# Ops computed by a different but equally accurate algorithm: a wider tolerance.
SCALE = {"pow": 4, "__rpow__": 4, "float_power": 4, "cosh": 2, "sinh": 2, "exp": 2,
         "special.zeta": 100, "igamma": 100, "igammac": 100, "polygamma.polygamma_n_1": 100,
         "polygamma.polygamma_n_2": 100, "polygamma.polygamma_n_3": 100,
         "polygamma.polygamma_n_4": 100, "special.airy_ai": 10, "special.bessel_y0": 10,
         "special.bessel_y1": 10, "special.bessel_j0": 10, "special.bessel_j1": 10,
         "nn.functional.mish": 4, "special.log_ndtr": 10, "special.ndtri": 10,
         "special.erfcx": 10, "digamma": 10, "lgamma": 10}


def _split(full: str) -> tuple[str, str]:
    for prefix in ("nn.functional.", "special.", "__"):
        if full.startswith(prefix):
            name, _, variant = full[len(prefix):].partition(".")
            return prefix + name, variant
    name, _, variant = full.partition(".")
    return name, variant


@pytest.mark.slow
@pytest.mark.parametrize("full", UNARY + BINARY + TERNARY + ACTIVATIONS + SPECIAL)
def test_opinfo_samples(full):
    name, variant = _split(full)
    check_opinfo(name, variant, scale=SCALE.get(full, 1.0))


def test_rrelu_noise_is_within_bounds_and_eval_mode_matches_cpu():
    x = torch.randn(200, dtype=torch.float64)
    d = x.to("pjrt")
    out = F.rrelu(d, 0.1, 0.3, training=True).cpu()
    slope = out[x < 0] / x[x < 0]
    assert ((slope >= 0.1) & (slope <= 0.3)).all() and (out[x >= 0] == x[x >= 0]).all()
    compare(lambda t: F.rrelu(t, 0.1, 0.3, training=False), x)
    g = torch.randn(200, dtype=torch.float64)
    d.requires_grad_(True)
    F.rrelu(d, 0.1, 0.3, training=True).backward(g.to("pjrt"))
    grad = d.grad.cpu()
    assert torch.allclose(grad[x >= 0], g[x >= 0])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_rrelu_in_place_writes_the_result_not_the_noise(mode):
    # rrelu_with_noise_ runs rrelu_with_noise's lowering, which returns (noise, result):
    # self got the noise (all zeros in eval mode, even for NaN and positive inputs)
    import torch_pjrt

    x = torch.tensor([NAN, -1.0, 2.0, -0.5, 0.0, INF, -INF])
    with torch_pjrt.set_eager_mode(mode):
        d = x.to("pjrt")
        out = F.rrelu(d, 0.1, 0.3, training=False, inplace=True)
        assert out is d
        assert_same(d, F.rrelu(x.clone(), 0.1, 0.3, training=False, inplace=True))
        noise = torch.zeros(7, device="pjrt")
        d = x.to("pjrt")
        torch.ops.aten.rrelu_with_noise_(d, noise, 0.1, 0.3, True)
        got, r = d.cpu(), noise.cpu()
    neg = x <= 0
    assert ((r[neg] >= 0.1) & (r[neg] <= 0.3)).all() and (r[~neg] == 1).all()
    torch.testing.assert_close(got, torch.where(neg, x * r, x), equal_nan=True)


# ------------------------------------------------------------------ edge values
EDGE_FLOAT = [NAN, INF, -INF, 0.0, -0.0, 1e-30, -1e-30, 0.25, -0.25, 0.5, -0.5, 1.0, -1.0,
              1.5, -1.5, 2.5, -2.5, 3.0, -3.0, 7.0, 20.0, -20.0, 88.5, -88.5, 1e10, -1e10]
EDGE_INT = [0, 1, -1, 2, -2, 3, -7, 7, 64, -64, 100, 2**31 - 1, -(2**31), 2**62,
            2**63 - 1, -(2**63)]


def _edge(dtype):
    if dtype == torch.bool:
        return torch.tensor([False, True])
    if dtype.is_complex:
        vals = [NAN, INF, -INF, 0.0, -0.0, 1.0, -2.5, 0.5, 1e10]
        return torch.tensor([complex(a, b) for a in vals for b in vals], dtype=dtype)
    if dtype.is_floating_point:
        return torch.tensor(EDGE_FLOAT, dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([v for v in EDGE_INT if info.min <= v <= info.max], dtype=dtype)


EDGE_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "sgn": torch.sgn,
    "angle": torch.angle, "ceil": torch.ceil, "floor": torch.floor, "trunc": torch.trunc,
    "round": torch.round, "round_decimals": lambda t: torch.round(t, decimals=2),
    "round_neg_decimals": lambda t: torch.round(t, decimals=-1), "frac": torch.frac,
    "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "reciprocal": torch.reciprocal, "sinc": torch.sinc, "nan_to_num": torch.nan_to_num,
    "nan_to_num_args": lambda t: torch.nan_to_num(t, 1.0, 2.0, -3.0),
    "logit": torch.logit, "logit_eps": lambda t: torch.logit(t, 0.25), "frexp": torch.frexp,
    "signbit": torch.signbit, "isnan": torch.isnan, "isinf": torch.isinf,
    "isposinf": torch.isposinf, "digamma": torch.digamma, "lgamma": torch.lgamma,
    "erfinv": torch.erfinv, "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "elu": F.elu, "selu": F.selu, "celu": F.celu, "hardtanh": F.hardtanh,
    "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish, "hardshrink": F.hardshrink,
    "softshrink": F.softshrink, "softplus": F.softplus, "logsigmoid": F.logsigmoid,
    "leaky_relu": F.leaky_relu, "threshold": lambda t: F.threshold(t, 0.5, -2.0),
    "bitwise_not": torch.bitwise_not, "logical_not": torch.logical_not,
    "pow_half": lambda t: t ** 0.5, "pow_neg_half": lambda t: t ** -0.5,
    "pow_two": lambda t: t ** 2, "pow_three": lambda t: t ** 3, "pow_neg_one": lambda t: t ** -1,
    "pow_third": lambda t: t ** (1 / 3), "square": torch.square,
    "bessel_j0": torch.special.bessel_j0, "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0, "bessel_y1": torch.special.bessel_y1,
    "k0": torch.special.modified_bessel_k0, "k1e": torch.special.scaled_modified_bessel_k1,
    "i0": torch.special.modified_bessel_i0, "i1": torch.special.modified_bessel_i1,
    "spherical_j0": torch.special.spherical_bessel_j0, "entr": torch.special.entr,
    "erfcx": torch.special.erfcx, "ndtri": torch.special.ndtri,
    "log_ndtr": torch.special.log_ndtr, "trigamma": lambda t: torch.polygamma(1, t),
    "polygamma2": lambda t: torch.polygamma(2, t),
}


# Functions whose value depends on the dtype (nan_to_num's default replacements are the
# dtype's largest numbers): a float64 run is no reference for the float32 one.
DTYPE_DEPENDENT = {"nan_to_num", "nan_to_num_args"}


def _cpu_accepts(fn, x):
    try:
        return fn(x)
    except (RuntimeError, NotImplementedError, TypeError):
        return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool,
                                   torch.complex64], ids=str)
@pytest.mark.parametrize("name", sorted(EDGE_UNARY))
def test_unary_edge_values(name, dtype):
    fn = EDGE_UNARY[name]
    x = _edge(dtype)
    expected = _cpu_accepts(fn, x)
    if expected is None:
        pytest.skip(f"the CPU does not accept {dtype}")
    before = fallbacks()
    actual = fn(x.to("pjrt"))
    # Near poles and for huge arguments the last bits differ between algorithms.
    scale = 100 if name in ("digamma", "lgamma", "trigamma", "polygamma2", "bessel_y0",
                            "bessel_y1", "bessel_j0", "bessel_j1", "k0", "k1e") else 1
    reference = _cpu_accepts(fn, x.double()) \
        if dtype == torch.float32 and name not in DTYPE_DEPENDENT else None
    if reference is None or not isinstance(expected, torch.Tensor) or \
            expected.dtype != dtype:
        result_dtype = expected.dtype if isinstance(expected, torch.Tensor) else dtype
        assert_same(actual, expected, **elementwise(result_dtype, scale))
    else:
        # The CPU's float32 kernels are themselves inexact by processor (which elements
        # take ATen's vector path depends on the vector width): pjrt is held to be as
        # accurate as they are against float64 (near poles and zeros of the scaled
        # functions, to an absolute error of as many ulps of 1).
        assert actual.device.type == "pjrt" and actual.dtype == expected.dtype
        ulps = elementwise(dtype, scale)["rtol"] / torch.finfo(dtype).eps
        assert_no_less_accurate(actual, expected, reference, ulps=ulps,
                                atol=0.0 if scale == 1 else ulps * torch.finfo(dtype).eps)
    assert not new_fallbacks(before)


EDGE_BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "sub": torch.sub,
    "mul": torch.mul, "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
    "pow": torch.pow, "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "xlogy": torch.xlogy, "xlog1py": torch.special.xlog1py, "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2, "heaviside": torch.heaviside, "nextafter": torch.nextafter,
    "eq": torch.eq, "lt": torch.lt, "ge": torch.ge, "logical_xor": torch.logical_xor,
    "clamp_min": torch.clamp_min, "clamp_max": torch.clamp_max,
    "clamp": lambda a, b: torch.clamp(a, b, b + 1), "zeta": torch.special.zeta,
    "igamma": torch.igamma, "igammac": torch.igammac, "gcd": torch.gcd, "lcm": torch.lcm,
    "bitwise_and": torch.bitwise_and, "shift_left": torch.bitwise_left_shift,
    "shift_right": torch.bitwise_right_shift, "lerp": lambda a, b: torch.lerp(a, b, 0.75),
    "lerp_tensor": lambda a, b: torch.lerp(a, a + 1, b), "isin": torch.isin,
}


def _edge_pairs(dtype):
    x = _edge(dtype)
    if dtype.is_complex:
        x = x[::3]
    a, b = zip(*itertools.product(x.tolist(), repeat=2))
    return torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)


def _nonzero_divisor(name, a, b):
    if name == "lcm" and not (a.dtype.is_floating_point or a.dtype.is_complex
                              or a.dtype == torch.bool):  # lcm(INT_MIN, .) traps on the CPU
        keep = (a != torch.iinfo(a.dtype).min) & (b != torch.iinfo(a.dtype).min)
        return a[keep], b[keep]
    if name in ("div_trunc", "div_floor", "floor_divide", "remainder", "fmod") \
            and not (a.dtype.is_floating_point or a.dtype.is_complex):
        # x / 0 raises, and INT_MIN / -1 traps (SIGFPE) in the CPU kernel itself.
        keep = b != 0
        if a.dtype != torch.bool:
            keep &= ~((a == torch.iinfo(a.dtype).min) & (b == -1))
        return a[keep], b[keep]
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool,
                                   torch.complex64], ids=str)
@pytest.mark.parametrize("name", sorted(EDGE_BINARY))
def test_binary_edge_values(name, dtype):
    fn = EDGE_BINARY[name]
    a, b = _nonzero_divisor(name, *_edge_pairs(dtype))
    if name in ("shift_left", "shift_right") and dtype == torch.int64:
        b = b.clamp(-1, 70)  # shift amounts: negative, in range and past the bit width
    expected = _cpu_accepts(lambda x: fn(x, b), a)
    if expected is None:
        pytest.skip(f"the CPU does not accept {dtype}")
    before = fallbacks()
    actual = fn(a.to("pjrt"), b.to("pjrt"))
    scale = 1000 if name in ("zeta", "igamma", "igammac") else 4 if name == "pow" else 1
    tol = {k: v * scale for k, v in tolerance(dtype).items()}
    assert_same(actual, expected, **tol)
    assert not new_fallbacks(before)


# ------------------------------------------------------------------ integer rules
@pytest.mark.parametrize("fn", [
    lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.fmod(a, b),
    lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: torch.remainder(a, 0),
])
def test_integer_division_by_zero_raises(fn):
    a, b = torch.tensor([5, -5]), torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a.to("pjrt"), b.to("pjrt")).cpu()


def test_integer_pow_rules():
    base = torch.tensor([-3, -2, -1, 0, 1, 2, 3])
    exp = torch.tensor([-3, -2, -1, 0, 1, 2, 63])
    compare(lambda a, b: (a ** b, a ** b.flip(0), 2 ** b.clamp(min=0), a ** 3), base, exp)
    compare(lambda a, b: a ** b, torch.tensor([3], dtype=torch.int32),
            torch.tensor([33], dtype=torch.int32))
    compare(lambda a, b: a ** b, torch.tensor([3, 200], dtype=torch.uint8),
            torch.tensor([7, 2], dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="negative integer powers"):
        (base.to("pjrt") ** -1).cpu()


def test_extreme_integer_division():
    a = torch.tensor([-(2**63), -(2**63), 7, -7])
    b = torch.tensor([-1, 1, -2, 2])
    # (trunc division of INT_MIN by -1 traps with SIGFPE in the CPU kernel: not compared)
    compare(lambda a, b: (a // b, a % b, torch.fmod(a, b),
                          torch.div(a[1:], b[1:], rounding_mode="trunc")), a, b)


def test_python_shift_operators():
    x = torch.tensor([1, -8, 255, 3], dtype=torch.int32)
    s = torch.tensor([0, 1, 31, 40], dtype=torch.int32)
    compare(lambda t, s: (t << 3, t >> 1, t << s, t >> s), x, s)


def test_in_place_and_out_variants():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    compare(lambda a, b: (a.clone().logaddexp_(b) if hasattr(a, "logaddexp_") else a,
                          torch.logit(a.sigmoid(), out=torch.empty_like(a)),
                          a.clone().hardshrink(), a.clone().nan_to_num_(),
                          torch.frexp(a, out=(torch.empty_like(a),
                                              torch.empty_like(a, dtype=torch.int32)))), x, y)


@pytest.mark.parametrize("fn", [
    lambda x: F.glu(x, 0), lambda x: F.glu(x, -1), F.logsigmoid, F.hardswish, F.hardsigmoid,
    lambda x: F.elu(x, 0.5), lambda x: F.softplus(x, 2.0, 1.0), F.mish, F.silu,
    lambda x: F.hardshrink(x, 0.3), lambda x: F.softshrink(x, 0.3), torch.logit,
    lambda x: torch.logit(x, 1e-3), F.gelu, lambda x: F.gelu(x, approximate="tanh"),
    lambda x: F.prelu(x, torch.tensor([0.25, -0.5, 0.1, 2.0], dtype=x.dtype).to(x.device)),
    lambda x: F.celu(x, 1.5), F.selu, lambda x: F.leaky_relu(x, 0.2),
])
def test_activation_gradients(fn):
    """Backward ops (glu_backward, log_sigmoid_backward, ...) against CPU autograd."""
    x = torch.randn(4, 4, dtype=torch.float64)
    x[0, 0], x[0, 1], x[1, 1] = 0.0, 3.0, -3.0
    x = x.sigmoid() if fn is torch.logit else x
    g = torch.randn_like(fn(x))
    before = fallbacks()
    cpu = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(fn(cpu), cpu, g)
    dev = to_device(x).requires_grad_(True)
    (actual,) = torch.autograd.grad(fn(dev), dev, g.to("pjrt"))
    assert_same(actual, expected, atol=1e-10, rtol=1e-10)
    assert not new_fallbacks(before)


def test_complex_abs_and_sgn_at_infinity():
    z = torch.tensor([complex(INF, NAN), complex(NAN, -INF), complex(3, 4), 0j,
                      complex(NAN, 1), complex(-INF, 0)], dtype=torch.complex64)
    compare(lambda t: (t.abs(), t.sgn(), t.angle(), torch.exp(t[2:])), z)


@pytest.mark.parametrize("exponent", [1 + 2j, 2, 0.5, 0, -1, -1 + 1j, 1j], ids=str)
def test_complex_zero_base_power_as_the_cpu(exponent):
    """A complex zero base: the CPU computes exp(y * log(0)) with C's rules (0 where
    real(y) > 0, inf+nanj where it is < 0, NaN where it is 0; 1 for a Scalar exponent of
    0); XLA's power gave NaN for 0**(1+2j) and 1 for 0**0 (the fuzzer found it)."""
    base = torch.tensor([0j, -0.0 + 0j, 1 + 1j, 2 - 0.5j], dtype=torch.complex64)
    y = torch.full((4,), exponent, dtype=torch.complex64)
    for fn, args in ((torch.pow, (base, exponent)), (torch.pow, (base, y)),
                     (torch.pow, (0j, y))):
        expected = torch.view_as_real(fn(*args))
        actual = fn(*(a.to("pjrt") if isinstance(a, torch.Tensor) else a for a in args))
        torch.testing.assert_close(torch.view_as_real(actual.cpu()), expected,
                                   equal_nan=True)  # (float32's elementwise bound)


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("op", [torch.floor, torch.ceil, torch.trunc], ids=lambda f: f.__name__)
def test_rounding_refuses_complex_as_cpu(op) -> None:
    # the CPU's NotImplementedError (a RuntimeError), functional and out= (PyTorch's
    # test_unary_op_out_casting), not JAX's TypeError
    x = torch.tensor([1.5 + 1j, -2.5 - 0.5j])
    for call in (lambda t: op(t), lambda t: op(t, out=torch.empty_like(t))):
        with pytest.raises(NotImplementedError) as cpu:
            call(x)
        with pytest.raises(NotImplementedError) as pjrt:
            call(x.to("pjrt"))
        assert str(cpu.value) in str(pjrt.value)
    assert_same(op(torch.tensor([1.5, -2.5]).to("pjrt")), op(torch.tensor([1.5, -2.5])))


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64],
                         ids=str)
def test_exp2_within_an_ulp_over_the_whole_range(dtype) -> None:
    # exp(x * ln 2) (jnp.exp2) was 3.6e-6 relative off at x = 99 in float32 and wrong near
    # the bottom of the range (PyTorch's test_reference_numerics_small_exp2 int64); the
    # outputs kept are the normal ones (XLA:CPU flushes subnormals to zero)
    top = {torch.float64: 1020, torch.bfloat16: 125, torch.int64: 60}.get(dtype, 125)
    x = torch.cat([torch.linspace(-top, top, 4001), torch.tensor([99.0, -125.5, 0.5, -0.0]),
                   torch.randn(500) * 10]).to(dtype)
    if dtype.is_floating_point:
        x = torch.cat([x, torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype)])
    expected = torch.exp2(x)
    actual = torch.exp2(x.to("pjrt")).cpu()
    # one rounding of the result's own dtype (the int64 input computes in float32)
    eps = torch.finfo(expected.dtype).eps
    torch.testing.assert_close(actual, expected, rtol=eps, atol=0, equal_nan=True)


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("name", ["sqrt", "log1p", "asin", "acos", "atan", "asinh", "acosh",
                                  "atanh"])
def test_complex_branch_cuts_follow_the_sign_of_zero(name, dtype) -> None:
    # on a branch cut the sign of a zero real or imaginary part picks the side: the CPU gives
    # sqrt(-1 - 0j) = -1j and asinh(-0 + 2j) = -1.317 + 1.571j, XLA's formulas gave +1j and
    # +1.317 + 1.571j (PyTorch's test_reference_numerics_small_asinh complex128)
    vals = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.14, -3.14, 1e-3, -1e-3]
    z = torch.tensor([complex(a, b) for a in vals for b in vals], dtype=dtype)
    fn = getattr(torch, name)
    expected = torch.view_as_real(fn(z))
    actual = torch.view_as_real(fn(z.to("pjrt")).cpu())
    torch.testing.assert_close(actual, expected, equal_nan=True)
    if name not in ("acos", "log1p"):  # (their zero results' signs differ: +-0, equal values)
        assert torch.equal(torch.signbit(actual), torch.signbit(expected))


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64,
                                   torch.uint16], ids=str)
def test_orthogonal_polynomials_of_integers_are_computed_in_float(dtype) -> None:
    # PyTorch's test_binary_ufuncs (test_contig_size1 and others) on integer operands: the
    # CPU computes in the default float dtype; pjrt kept the integer dtype (uint8's Hermite
    # H_6(5) wrapped to 56, Legendre's and Laguerre's divisions failed to trace)
    x = torch.tensor([0, 1, 2, 3, 5, 7], dtype=dtype)
    n = torch.tensor([3, 2, 4, 1, 6, 5], dtype=dtype)
    names = [name for name in dir(torch.special) if "_polynomial_" in name]
    assert len(names) == 12
    for name in names:
        fn = getattr(torch.special, name)
        got = compare(fn, x, n)
        assert got.dtype == torch.float32, name


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                         ids=str)
def test_nextafter_is_the_cpus_bit_for_bit(dtype) -> None:
    # PyTorch's test_nextafter_bfloat16: bfloat16 was stepped in float32 and rounded back
    # (nextafter(1, 2) gave 1, nextafter(0, 1) gave 0), and subnormal operands compared as
    # zero on XLA:CPU (nextafter(1e-40, 0) gave 0 in float32)
    vals = [0.0, -0.0, 1.0, -1.0, 2.0, 20.0, -3000.0, 65536.0, math.inf, -math.inf, math.nan,
            1e-40, -1e-40, 1e-310, 3.3e38, 65504.0, 6e-8]
    pairs = list(itertools.product(vals, vals))
    x = torch.tensor([a for a, _ in pairs], dtype=dtype)
    y = torch.tensor([b for _, b in pairs], dtype=dtype)
    expected = torch.nextafter(x, y)
    got = torch.nextafter(x.to("pjrt"), y.to("pjrt")).cpu()
    same = (got == expected) & (torch.signbit(got) == torch.signbit(expected))
    same |= got.isnan() & expected.isnan()
    assert bool(same.all()), [(pairs[i], expected[i].item(), got[i].item())
                              for i in (~same).nonzero().flatten()[:5].tolist()]


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_trunc_division_rounds_the_quotient_to_the_dtype_first(dtype) -> None:
    # PyTorch's test_div_rounding_numpy_float16: the CPU rounds a float16 (bfloat16)
    # quotient to the dtype before truncating, 56672 / 31.3125 = 1809.97 -> 1810; pjrt
    # truncated the float32 quotient (1809). By a one-element divisor the CPU divides in
    # float32 and truncates there, and so does pjrt.
    g = torch.Generator().manual_seed(0)
    a = ((torch.rand(20000, generator=g) - 0.5) * 2000).to(dtype)
    b = ((torch.rand(20000, generator=g) - 0.5) * 60).to(dtype)
    b[b == 0] = 1
    a[:2] = torch.tensor([56672.0, -26192.0]).to(dtype)
    b[:2] = torch.tensor([31.3125, -1139.0]).to(dtype)
    for divisor in (b, b[3:4], b[3]):
        expected = torch.div(a, divisor, rounding_mode="trunc")
        got = torch.div(a.to("pjrt"), divisor.to("pjrt"), rounding_mode="trunc").cpu()
        assert torch.equal(got, expected), (expected != got).sum()


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_a_number_where_the_op_takes_a_tensor(dtype) -> None:
    # PyTorch's test_xlogy_xlog1py and test_type_promotion of the polynomials: xlogy(2.0, t)
    # reaches pjrt as xlogy.Tensor with the number wrapped as a tensor, and pjrt's meta
    # step, calling the overload with the number, raised "Expected a value of type
    # 'Tensor' for argument 'self'"
    y = torch.tensor([1, 2, 0, 1], dtype=dtype)
    for fn in (lambda t: torch.xlogy(2.0, t), lambda t: torch.xlogy(t, 3),
               lambda t: torch.special.xlogy(2, t), lambda t: torch.special.xlog1py(2.0, t),
               lambda t: torch.special.xlog1py(t, 2.0),
               lambda t: torch.special.chebyshev_polynomial_t(t, 2),
               lambda t: torch.special.shifted_chebyshev_polynomial_u(2.0, t)):
        got = compare(fn, y)
        assert got.dtype == fn(y).dtype


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("half,out_dtype", [(torch.float16, torch.float64),
                                            (torch.bfloat16, torch.float32)])
def test_an_out_of_a_wider_dtype_gets_the_half_result(half, out_dtype) -> None:
    """PyTorch computes in the operands' common dtype whatever out='s dtype is, rounding
    the float32 opmath result to it before the write (test_type_promotion's
    test_computation_ignores_out): float16 33000 + 33000 is inf even into a float64 out."""
    a = torch.tensor([33000.0, 1.5, 1.1, 2.3, -3.7, 3e38 if half == torch.bfloat16 else 6e4])
    b = torch.tensor([33000.0, 0.666, 1.1, 2.3, 3.7, 3e38 if half == torch.bfloat16 else 6e4])
    a, b = a.to(half), b.to(half)
    for op in (torch.add, torch.mul, torch.true_divide, torch.sub, torch.atan2):
        want = op(a, b, out=torch.empty(6, dtype=out_dtype))
        got = op(a.to("pjrt"), b.to("pjrt"), out=torch.empty(6, dtype=out_dtype, device="pjrt"))
        assert torch.equal(got.cpu(), want), (op, got, want)
