"""CPU tensors moved to pjrt with `.to()`: the values, dtype, strides and memory format
PyTorch gives, for the plain upload (a contiguous tensor as it is: one transfer) and for
every case that goes the general way (another dtype, layout, memory format, strides)."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")

DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex32]


def _expected(x: torch.Tensor, **kwargs) -> torch.Tensor:
    """What `.to()` gives on the CPU (the reference for values, strides and dtype)."""
    return x.to("cpu", copy=True, **kwargs)


def _check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == "pjrt"
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride()
    if want.dtype == torch.complex32:  # the CPU compares no complex32
        got, want = got.to(torch.complex64), want.to(torch.complex64)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5)])
def test_contiguous_uploads(dtype, shape):
    x = torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype)
    _check(x.to("pjrt"), _expected(x))
    _check(x.to("pjrt:0", non_blocking=True), _expected(x))
    _check(x.to(device="pjrt", memory_format=torch.contiguous_format), _expected(x))


def test_the_upload_is_a_private_copy():
    x = torch.arange(6.0)
    d = x.to("pjrt")
    x.add_(100)  # the caller may reuse its tensor at once
    x.resize_(12)  # and it stays resizable
    assert torch.equal(d.cpu(), torch.arange(6.0))


def test_conjugate_and_negative_views_are_resolved():
    z = torch.randn(4, dtype=torch.complex64)
    _check(z.conj().to("pjrt"), z.conj().resolve_conj())
    _check(torch._neg_view(z).to("pjrt"), torch._neg_view(z).resolve_neg())


@pytest.mark.parametrize("kwargs", [{"dtype": torch.float64}, {"dtype": torch.int32},
                                    {"memory_format": torch.channels_last}])
def test_conversions_on_the_way(kwargs):
    x = torch.randn(2, 3, 4, 5)
    _check(x.to("pjrt", **kwargs), _expected(x, **kwargs))


def test_strided_tensors_keep_their_strides():
    x = torch.randn(4, 6).t()  # preserve_format keeps a dense permutation's strides
    _check(x.to("pjrt"), _expected(x))
    y = torch.randn(4, 6)[:, ::2]  # not dense: made contiguous, as on every device
    _check(y.to("pjrt"), _expected(y))
    c = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    _check(c.to("pjrt"), _expected(c))
