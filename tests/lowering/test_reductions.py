"""Reductions and scans on pjrt against the CPU: OpInfo samples (forward and backward),
NaN propagation, empty and 0-dim inputs, dtype arguments, integer accumulation."""

import math

import pytest
import torch
from helpers import compare
from math_diff import ALL_DTYPES, FLOAT_DTYPES, check_opinfo, fallbacks, new_fallbacks

NAN, INF = math.nan, math.inf

OPS = (
    "sum", "mean", "nansum", "nanmean", "prod", "amax", "amin", "aminmax",
    "max.reduction_no_dim", "max.reduction_with_dim", "min.reduction_no_dim",
    "min.reduction_with_dim", "argmax", "argmin", "var", "var.unbiased", "std", "std.unbiased",
    "var_mean", "var_mean.unbiased", "std_mean", "std_mean.unbiased", "any", "all",
    "logsumexp", "linalg.vector_norm", "norm", "norm.fro", "norm.inf", "cumsum", "cumprod",
    "logcumsumexp", "count_nonzero", "masked.sum", "masked.mean", "masked.amax",
    "masked.logsumexp", "masked.norm", "masked.var",
)


@pytest.mark.slow
@pytest.mark.parametrize("full", OPS)
def test_opinfo_samples(full):
    name, _, variant = full.partition(".")
    if name in ("masked", "linalg"):
        name, variant = full, ""
    # masked.var of complex input multiplies by a conjugate view (not yet read conjugated)
    dtypes = FLOAT_DTYPES if full == "masked.var" else ALL_DTYPES
    # logcumsumexp's float32 backward is ill-conditioned on these samples: the CPU itself is
    # 2e-3 away from float64.
    scale = {"cumprod": 4.0, "prod": 4.0, "logcumsumexp": 100.0}.get(name, 1.0)
    check_opinfo(name, variant, dtypes=dtypes, scale=scale)


@pytest.mark.parametrize("fn", [
    lambda t: t.max(), lambda t: t.min(), lambda t: t.amax(1), lambda t: t.amin(0),
    lambda t: t.max(1), lambda t: t.min(0), lambda t: t.argmax(), lambda t: t.argmin(1),
    lambda t: t.aminmax(), lambda t: t.aminmax(dim=1), lambda t: t.sum(1), lambda t: t.mean(0),
    lambda t: t.nansum(1), lambda t: t.logsumexp(1), lambda t: t.cumsum(1),
    lambda t: t.logcumsumexp(1), lambda t: t.var(1), lambda t: t.norm(dim=1),
    lambda t: torch.linalg.vector_norm(t, INF, 1), lambda t: t.prod(1),
])
def test_nan_and_infinity(fn):
    """max/min/amax propagate NaN; argmax/argmin pick the first NaN."""
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [INF, -INF, 2.0, 2.0], [-1.0, -1.0, -INF, 0.0],
                      [INF, INF, 1.0, -0.0]])
    before = fallbacks()
    compare(fn, x)
    assert not new_fallbacks(before)


@pytest.mark.parametrize("fn", [
    lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.prod(), lambda t: t.mean(),
    lambda t: t.logsumexp(0), lambda t: t.any(), lambda t: t.all(), lambda t: t.cumsum(0),
    lambda t: t.count_nonzero(), lambda t: t.nansum(), lambda t: t.var(0),
    lambda t: torch.linalg.vector_norm(t), lambda t: t.amax(1), lambda t: torch.std_mean(t, 0),
])
def test_empty_inputs(fn):
    """Reductions over zero elements give their identity (sum 0, prod 1, logsumexp -inf)."""
    compare(fn, torch.empty(0, 3))


@pytest.mark.parametrize("fn", [lambda t: t.max(), lambda t: t.min(), lambda t: t.argmax(),
                                lambda t: t.amax(0), lambda t: t.aminmax()])
def test_empty_reduction_without_identity_raises(fn):
    with pytest.raises((RuntimeError, IndexError)):
        r = fn(torch.empty(0, device="pjrt"))
        (r[0] if isinstance(r, tuple) else r).cpu()


@pytest.mark.parametrize("fn", [
    lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.max(0), lambda t: t.argmax(0),
    lambda t: t.argmin(), lambda t: t.cumsum(0), lambda t: t.cumprod(0), lambda t: t.var(),
    lambda t: t.logsumexp(0), lambda t: t.amax(), lambda t: t.mean(0, keepdim=True),
    lambda t: t.logcumsumexp(0), lambda t: torch.std_mean(t, 0), lambda t: t.aminmax(dim=0),
])
def test_zero_dim_inputs(fn):
    compare(fn, torch.tensor(2.5))


@pytest.mark.parametrize("fn", [
    lambda t: t.sum(), lambda t: t.sum(1, dtype=torch.float64), lambda t: t.prod(0),
    lambda t: t.cumsum(1), lambda t: t.cumprod(1, dtype=torch.float32),
    lambda t: t.mean(dtype=torch.float64), lambda t: t.max(1), lambda t: t.argmax(1),
    lambda t: t.count_nonzero(0), lambda t: t.amax(0), lambda t: t.nansum(1),
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool],
                         ids=str)
def test_integer_and_bool_accumulation(fn, dtype):
    x = torch.tensor([[2**31 - 1, 5, 0], [2**31 - 1, 7, 1]]).to(dtype)
    try:
        fn(x)
    except RuntimeError:
        pytest.skip("the CPU rejects it")
    compare(fn, x)


def test_argmax_ties_pick_the_first_index():
    x = torch.tensor([[1, 3, 3, 0], [2, 2, 1, 2]])
    compare(lambda t: (t.argmax(1), t.argmin(1), t.max(1), t.min(0), t.argmax()), x)


def test_reduced_precision_accumulates_in_float32():
    x = torch.full((4096,), 1.0, dtype=torch.bfloat16)
    compare(lambda t: (t.sum(), t.mean(), t.cumsum(0)[-1], torch.linalg.vector_norm(t)),
            x, atol=0, rtol=0)


@pytest.mark.parametrize("correction", [0, 1, 2.5, 10])
def test_var_corrections(correction):
    x = torch.randn(3, 5, dtype=torch.float64)
    compare(lambda t: (t.var(1, correction=correction), t.std(0, correction=correction),
                       torch.var_mean(t, 1, correction=correction, keepdim=True),
                       torch.std_mean(t, correction=correction)), x)


@pytest.mark.parametrize("ord", [0, 1, 2, 3, 0.5, -1, -2, INF, -INF])
def test_vector_norm_orders(ord):
    x = torch.randn(3, 4, dtype=torch.float64)
    x[0, 0] = 0.0
    compare(lambda t: (torch.linalg.vector_norm(t, ord), torch.linalg.vector_norm(t, ord, 1),
                       torch.linalg.vector_norm(t.to(torch.complex128), ord, (0, 1))), x)


def test_logsumexp_complex_and_infinite_rows():
    z = torch.randn(4, 5, dtype=torch.complex64) * 3
    compare(lambda t: torch.logsumexp(t, 1), z)
    x = torch.tensor([[-INF, -INF], [INF, INF], [INF, -INF], [1.0, 2.0]])
    compare(lambda t: (torch.logsumexp(t, 1), torch.logcumsumexp(t, 1)), x)


def test_reduction_gradients():
    x = torch.randn(3, 4, dtype=torch.float64)
    x[1, 2] = x[1, 1]  # a tie for max

    def grads(t):
        t = t.requires_grad_(True)
        out = (t.sum(1) * 2 + t.amax(1) + t.logsumexp(1) + t.var(1) + t.norm(dim=1)
               + t.cumsum(1)[:, -1] + t.prod(1) + t.max(1).values + t.logcumsumexp(1)[:, 2])
        return torch.autograd.grad(out.sum(), t)[0]

    compare(grads, x)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32, torch.float64, torch.bfloat16,
                                       torch.bool], ids=str)
@pytest.mark.parametrize("op", ["sum", "sum_all", "prod", "nansum", "mean", "cumsum",
                                "cumprod"])
def test_out_tensor_of_another_dtype_sets_the_computation(op, out_dtype, mode):
    """sum(x, 1, out=int64_tensor) casts each element before summing, as the CPU kernel
    does: -0.75 + 1.6 is 0 + 1 = 1, not int(0.85) = 0 (a silent wrong result until
    December 3; the fuzzer found it)."""
    import torch_pjrt

    x = torch.tensor([[-0.75, 1.6, 2.5, -2.9], [0.4, -1.2, 3.9, 1.5], [2.7, 0.2, -3.5, 1.1]])
    call = {
        "sum": lambda t, o: torch.sum(t, 1, out=o), "sum_all": lambda t, o: torch.sum(
            t, (0, 1), out=o), "prod": lambda t, o: torch.prod(t, 1, out=o),
        "nansum": lambda t, o: torch.nansum(t, 1, out=o),
        "mean": lambda t, o: torch.mean(t, 1, out=o),
        "cumsum": lambda t, o: torch.cumsum(t, 1, out=o),
        "cumprod": lambda t, o: torch.cumprod(t, 1, out=o),
    }[op]
    shape = {"sum_all": (), "cumsum": x.shape, "cumprod": x.shape}.get(op, (3,))
    expected = torch.zeros(shape, dtype=out_dtype)
    try:
        call(x, expected)
    except (RuntimeError, NotImplementedError):
        pytest.skip("the CPU rejects it")
    before = torch_pjrt.get_eager_mode()
    torch_pjrt.set_eager_mode(mode)
    try:
        actual = torch.zeros(shape, dtype=out_dtype, device="pjrt")
        call(x.to("pjrt"), actual)
        actual = actual.cpu()
    finally:
        torch_pjrt.set_eager_mode(before)
    torch.testing.assert_close(actual, expected, rtol=1e-2, atol=1e-6)


@pytest.mark.usefixtures("eager_mode")
def test_empty_dim_list_reduces_all_or_raises() -> None:
    # dim=[] reduces every dimension on the CPU; for nansum (and nanmean, built on it)
    # PyTorch's meta kernel keeps the input's shape instead, and pjrt's output took that
    # shape: the broadcast total, a wrong result (PyTorch's test_dim_empty_nansum). pjrt
    # raises there, and the other reductions keep matching the CPU
    x = torch.tensor([[1.0, NAN, 3.0], [4.0, 5.0, 6.0]])
    for fn in (lambda t: torch.sum(t, dim=[]), lambda t: torch.mean(t, dim=[]),
               lambda t: torch.amax(t, dim=[]), lambda t: torch.sum(t, dim=[], keepdim=True),
               lambda t: torch.nansum(t[0, 0], dim=[])):
        compare(fn, x)
    for fn in (lambda t: torch.nansum(t, dim=[]), lambda t: torch.nanmean(t, dim=[]),
               lambda t: torch.nansum(t, dim=(), keepdim=True)):
        with pytest.raises(RuntimeError, match=r"nansum\(\): dim=\[\]"):
            fn(x.to("pjrt")).cpu()


@pytest.mark.usefixtures("eager_mode")
def test_logcumsumexp_into_an_out_tensor():
    # PyTorch's test_logcumsumexp: torch.logcumsumexp(..., out=) calls _logcumsumexp.out,
    # which has no meta kernel in PyTorch: every out= call raised NotImplementedError
    x = torch.randn(5, 2)
    for out in (torch.zeros(5, 2), torch.empty(0), torch.zeros(5, 4)[:, ::2]):
        got = compare(lambda t, o: torch.logcumsumexp(t, 1, out=o), x, out.clone())
        assert tuple(got.shape) == (5, 2)
    with pytest.raises(RuntimeError, match="expected scalar_type Double but found Float"):
        torch.logcumsumexp(x.double().to("pjrt"), 1, out=torch.zeros(5, 2, device="pjrt"))
