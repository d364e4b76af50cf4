"""Factories with out= (arange, linspace, logspace), differential against CPU in each eager
mode."""

import re

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")


def _both(fn, shape, dtype):
    """fn(out) on a zeroed CPU and pjrt base: the bases and results after the call."""
    got = []
    for device in ("cpu", "pjrt"):
        base = torch.zeros(shape, dtype=dtype, device=device)
        result = fn(base)
        got.append((base.cpu(), result.cpu()))
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_out_of_the_right_size_keeps_its_shape(dtype):
    # CPU and CUDA resize the out= tensor only where its element count is not the result's:
    # a [2, 2] view gets the 4 values row-major, in place (PyTorch's
    # test_linspace / test_logspace checks). pjrt resized it to [4], writing other elements
    # of the base.
    calls = {
        "linspace": lambda b: torch.linspace(0, 3, 4, out=b.narrow(1, 1, 2), dtype=dtype),
        "logspace": lambda b: torch.logspace(0, 3, 4, out=b.narrow(1, 1, 2), dtype=dtype),
        "arange": lambda b: torch.arange(0, 4, out=b.narrow(1, 1, 2)),
        "arange_t": lambda b: torch.arange(0, 6, out=b.t()),
        "linspace_grow": lambda b: torch.linspace(0, 1, 8, out=b.narrow(1, 1, 2)),
    }
    for name, fn in calls.items():
        (cpu_base, cpu_out), (dev_base, dev_out) = _both(fn, (2, 3), dtype)
        assert dev_out.shape == cpu_out.shape, name
        torch.testing.assert_close(dev_out, cpu_out, msg=name)
        if name != "linspace_grow":  # a resized non-contiguous out: storage use differs
            torch.testing.assert_close(dev_base, cpu_base, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.complex64])
def test_logspace_values(dtype):
    cases = [(0, 3, 4, 10.0), (-2.5, 3.7, 7, 2.0), (-2, 3, 1, 10.0), (0, 1, 0, 10.0),
             (0, 3, 4, -2.0), (1, -1, 5, 0.5)]
    for start, end, steps, base in cases:
        expected = torch.logspace(start, end, steps, base=base, dtype=dtype)
        got = torch.logspace(start, end, steps, base=base, dtype=dtype, device="pjrt").cpu()
        torch.testing.assert_close(got, expected, msg=str((start, end, steps, base)))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32,
                                   torch.int64])
def test_integral_linspace_is_the_cpus(dtype):
    # XLA made (end - start) / 49 a product with 1/49, an ulp low: the truncated values
    # lost 1 (PyTorch's test_linspace_vs_numpy_integral). start and end are taken in the
    # result's dtype first: truncated, a negative integer wrapped around uint8, a value out
    # of range refused ("value cannot be converted to type int8_t without overflow").
    cases = [(1, 127, 25), (1, 127, 50), (1.7, 99.2, 33), (-100, 100, 401), (2, 0, 3),
             (-3.5, 7.9, 17), (-300, 3, 5), (0, 40000, 7), (0, 1, 1)]
    for start, end, steps in cases:
        try:
            expected = torch.linspace(start, end, steps, dtype=dtype)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=str(e)):
                torch.linspace(start, end, steps, dtype=dtype, device="pjrt").cpu()
            continue
        got = torch.linspace(start, end, steps, dtype=dtype, device="pjrt").cpu()
        assert torch.equal(got, expected), (start, end, steps)


_INT64 = torch.iinfo(torch.int64)


@pytest.mark.parametrize("case", [
    # (dtype, call, lowest, highest): the CPU's inclusive bounds of random_
    (torch.float32, lambda t: t.random_(-2**24, None), -2**24, 2**24),  # was up to 2**23
    (torch.bfloat16, lambda t: t.random_(-2**8, None), -2**8, 2**8),
    (torch.float16, lambda t: t.random_(32752), 0, 32736),  # 32752 - 1 rounds up to 32752
    (torch.float64, lambda t: t.random_(), 0, 2**53),
    (torch.int64, lambda t: t.random_(), 0, _INT64.max),  # raised OverflowError
    (torch.int64, lambda t: t.random_(_INT64.min, None), _INT64.min, _INT64.max),
    (torch.int8, lambda t: t.random_(-128, None), -128, 127),
    (torch.bool, lambda t: t.random_(0, None), 0, 1),
])
def test_random_bounds_are_the_cpus(case):
    # PyTorch's test_random_full_range, test_random_to and test_random_default: every value
    # within the CPU's bounds, the extremes within a tenth of the range of them
    dtype, call, low, high = case
    torch.manual_seed(0)
    t = torch.empty(20000, dtype=dtype, device="pjrt")
    call(t)
    values = t.cpu().double()
    delta = max(1, 0.1 * (high - low + 1))
    assert low <= values.min().item() < low + delta
    assert high - delta < values.max().item() <= high


def test_randperm_refuses_an_n_its_dtype_cannot_count_to():
    # PyTorch's test_randperm: randperm(2**24 + 2, out=float32) ran on pjrt (the CPU's
    # precision check is in no meta function, and the call is too large for the CPU
    # stand-ins that catch the rest)
    for dtype, small, large in [(torch.uint8, 2**8, 2**8 + 1),
                                (torch.float16, 2**11 + 1, 2**11 + 2),
                                (torch.float32, 2**10, 2**24 + 2),
                                (torch.float64, 2**10, 2**53 + 2)]:
        out = torch.empty(0, dtype=dtype, device="pjrt")
        torch.randperm(small, out=out)
        assert sorted(out.cpu().long().tolist()) == list(range(small))
        with pytest.raises(RuntimeError) as cpu_error:
            torch.randperm(large, out=torch.empty(0, dtype=dtype))
        with pytest.raises(RuntimeError, match=re.escape(str(cpu_error.value))):
            torch.randperm(large, out=out)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int64, torch.bfloat16,
                                   torch.float32, torch.float64])
def test_geometric_fills_every_dtype_the_cpu_fills(dtype):
    # PyTorch's test_geometric: integer tensors raised (PyTorch's decomposition draws
    # rand_like(x), which they refuse); the CPU's kernel fills them, with the same law
    torch.manual_seed(0)
    values = torch.empty(50000, dtype=dtype, device="pjrt").geometric_(0.25).cpu()
    assert values.dtype == dtype and values.min().item() == 1
    assert abs(values.double().mean().item() - 4.0) < 0.1  # 1 / p
    share_of_ones = (values == 1).double().mean().item()
    assert abs(share_of_ones - 0.25) < 0.01  # p
    for p in (0.0, 1.0, -0.5):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.empty(3, dtype=dtype).geometric_(p)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu_error.value))):
            torch.empty(3, dtype=dtype, device="pjrt").geometric_(p).cpu()


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_of_no_rows(replacement):
    # PyTorch's test_multinomial_empty_w(o)_replacement: the lowering's checks reduced over
    # the empty probabilities (ValueError); the CPU returns no rows
    for samples in (1, 2):
        expected = torch.multinomial(torch.ones(0, 3), samples, replacement)
        got = torch.multinomial(torch.ones(0, 3, device="pjrt"), samples, replacement)
        assert got.dtype == expected.dtype and got.shape == expected.shape == (0, samples)
