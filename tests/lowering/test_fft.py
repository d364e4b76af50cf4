"""torch.fft on pjrt against the CPU: OpInfo samples (forward and backward), every norm
mode, onesided and two-sided real transforms, odd and even output sizes."""

import pytest
import torch
from helpers import compare
from math_diff import check_opinfo, fallbacks, new_fallbacks

FFT_OPS = ("fft", "fft2", "fftn", "ifft", "ifft2", "ifftn", "rfft", "rfft2", "rfftn", "irfft",
           "irfft2", "irfftn", "hfft", "hfft2", "hfftn", "ihfft", "ihfft2", "ihfftn")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


# PyTorch computes these through a conjugate view (x.conj()), which the executor does
# not yet read conjugated (see the report); they pass once it does.
_CONJ_VIEWS = pytest.mark.xfail(reason="conjugate views are read unconjugated",
                                  strict=False)


def _cases():
    for name in FFT_OPS:
        for dtype in DTYPES:
            real = not dtype.is_complex
            uses_conj = name.startswith(("hfft", "ihfft")) or (name.startswith("ifft") and real)
            yield pytest.param(name, dtype, marks=[_CONJ_VIEWS] if uses_conj else [],
                               id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.slow
@pytest.mark.parametrize("name,dtype", list(_cases()))
def test_opinfo_samples(name, dtype):
    check_opinfo("fft." + name, dtypes=(dtype,), scale=10.0)


TRANSFORMS = {  # name: (fn(t, norm), takes real input, takes complex input)
    "fft": (lambda t, norm: torch.fft.fft(t, norm=norm), True, True),
    "ifft": (lambda t, norm: torch.fft.ifft(t, norm=norm), False, True),
    "rfft": (lambda t, norm: torch.fft.rfft(t, norm=norm), True, False),
    "irfft": (lambda t, norm: torch.fft.irfft(t, norm=norm), False, True),
    "irfft_odd": (lambda t, norm: torch.fft.irfft(t, 9, norm=norm), False, True),
    "rfftn": (lambda t, norm: torch.fft.rfftn(t, dim=(0, 2), norm=norm), True, False),
    "irfftn": (lambda t, norm: torch.fft.irfftn(t, s=(4, 7), dim=(1, 2), norm=norm), False,
               True),
    "fftn": (lambda t, norm: torch.fft.fftn(t, s=(3, 8), dim=(0, -1), norm=norm), True, True),
    "ifftn": (lambda t, norm: torch.fft.ifftn(t, dim=(0, 1), norm=norm), False, True),
}


@pytest.mark.parametrize("norm", [None, "forward", "backward", "ortho"])
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_norm_modes_and_sizes(name, norm):
    fn, real, complex_ = TRANSFORMS[name]
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    before = fallbacks()
    if real:
        compare(lambda t: fn(t, norm), x, atol=1e-10, rtol=1e-10)
    if complex_:
        compare(lambda t: fn(t, norm), torch.complex(x, x.flip(0)), atol=1e-10, rtol=1e-10)
    assert not new_fallbacks(before)


def test_two_sided_real_transform():
    x = torch.randn(3, 8)
    compare(lambda t: torch.ops.aten._fft_r2c(t, [1], 0, False), x)
    compare(lambda t: torch.ops.aten._fft_r2c(t, [0, 1], 2, True), x)


def test_fft_gradients():
    x = torch.randn(4, 6, dtype=torch.float64)

    def f(t):
        t = t.requires_grad_(True)
        out = (torch.fft.rfft(t).abs().sum() + torch.fft.irfft(torch.fft.fft(t)).sum()
               + torch.fft.fftn(t, norm="ortho").real.pow(2).sum())
        return torch.autograd.grad(out, t)[0]

    compare(f, x, atol=1e-10, rtol=1e-10)
