"""Every supported dtype round-trips exactly; int64 and float64 stay 64-bit."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]


def _sample(dtype):
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    if dtype.is_complex:
        return torch.randn(5, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(5).to(dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, 0, 1, info.max], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_and_arithmetic(dtype):
    x = _sample(dtype)
    d = x.to("pjrt")
    assert d.dtype == dtype
    assert torch.equal(d.cpu(), x)
    if dtype != torch.bool:
        torch.testing.assert_close((d + d).cpu(), x + x)


def test_int64_and_float64_are_exact():
    big = torch.tensor([2**62 + 1, -(2**62) - 3], dtype=torch.int64)
    d = big.to("pjrt")
    assert torch.equal((d + 1).cpu(), big + 1)
    assert (d * 2).cpu().tolist() == (big * 2).tolist()
    f = torch.tensor([1 + 2**-40], dtype=torch.float64)
    assert (f.to("pjrt") * 3).cpu().item() == (f * 3).item()
    assert torch.arange(5, device="pjrt").dtype == torch.int64
    assert torch.tensor(3.5, dtype=torch.float64).to("pjrt").sum().dtype == torch.float64


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="not supported on the pjrt device"):
        torch.empty(2, dtype=torch.float8_e8m0fnu, device="pjrt")
    # inside an operator too (a TypeError there read "unsupported operand type(s) for +")
    with pytest.raises(NotImplementedError, match="float8_e8m0fnu"):
        torch.ones(2, device="pjrt").to(torch.float8_e8m0fnu)


@pytest.mark.parametrize("dst", [torch.uint8, torch.uint16, torch.uint32], ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                 torch.complex64], ids=str)
def test_floating_to_unsigned_goes_through_int64_as_on_cpu_and_cuda(src, dst):
    """PyTorch defines a floating value to an unsigned integer as through int64 (-1.5 is
    255 in uint8, 300.2 is 44); XLA saturates (0, 255): images cast with .to(uint8) after
    arithmetic that went below 0 were silently 0 until December 3."""
    x = torch.tensor([-1.5, -3.0, 0.7, 2.5, 300.2, -200.7, 60000.0]).to(src)
    expected = x.to(dst)
    d = x.to("pjrt")
    assert torch.equal(d.to(dst).cpu(), expected)  # _to_copy
    out = torch.zeros(7, dtype=dst, device="pjrt")
    out.copy_(d)  # copy_ from the device
    assert torch.equal(out.cpu(), expected)
    out = torch.zeros(7, dtype=dst, device="pjrt")
    out.copy_(x)  # copy_ from the CPU
    assert torch.equal(out.cpu(), expected)
    if src == torch.float32:
        out = torch.zeros(7, dtype=dst, device="pjrt")
        out[::1] = torch.tensor(-1.5)  # a CPU 0-dim value: fill_
        assert out.cpu().tolist() == [255 if dst == torch.uint8 else expected[0].item()] * 7


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=str)
def test_float8_e4m3fn_saturates_as_on_cpu_and_cuda(src):
    """Past float8_e4m3fn's range PyTorch's conversion gives +-448 (CUDA's is SATFINITE);
    XLA's gave NaN, which an fp8 cast of an unscaled activation spread silently."""
    x = torch.tensor([1e4, -1e4, float("inf"), float("-inf"), float("nan"), 470.0, 1.0])
    x = x.to(src)
    got = x.to("pjrt").to(torch.float8_e4m3fn).cpu().float()
    want = x.to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.mark.parametrize("dst", FLOAT8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                 torch.int64], ids=str)
def test_float8_conversions_match_cpu_bit_for_bit(src, dst):
    """Every float8 format, to and from the wider types: rounding, subnormals, overflow
    (saturation for e4m3fn, NaN for the fnuz formats, which have no infinity) and the
    fnuz formats' lack of negative zero, as the CPU converts them."""
    x = torch.tensor([0.0, -0.0, 1.0, -1.5, 0.3, 240.0, 241.0, 250.0, 300.0, 57344.0, 6e4,
                      1e6, -1e6, 1e-3, 3e-5, 2.0**-10, float("inf"), float("-inf")])
    if src == torch.int64:
        x = x[x.isfinite()].clamp(-1e6, 1e6)
    x = x.to(src)
    got = x.to("pjrt").to(dst)
    want = x.to(dst)
    number = ~want.float().isnan()  # NaN's sign bit may differ
    assert torch.equal(got.cpu().view(torch.uint8)[number], want.view(torch.uint8)[number])
    assert torch.equal(got.cpu().float().isnan(), want.float().isnan())
    # and back, on the device; item() reads one element
    torch.testing.assert_close(got.float().cpu(), want.float(), equal_nan=True, rtol=0, atol=0)
    assert got[3].item() == want[3].item()
