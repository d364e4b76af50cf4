"""complex32 (complex half): stored as PyTorch lays it out (float16 parts), computed in
complex64 and rounded to float16 parts where a result is stored, as the CPU's kernels
compute ComplexHalf in complex<float>. Compared bit for bit with the CPU, in every eager
mode and under torch.compile."""

import warnings

import pytest
import torch

pytestmark = [pytest.mark.usefixtures("eager_mode"),
              pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")]

C32 = torch.complex32


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The float16 parts as integers: equal bits, NaN and signed zeros included (the CPU
    has no torch.equal for complex32)."""
    return torch.view_as_real(t.cpu()).view(torch.int16)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == C32 and got.shape == want.shape
    assert torch.equal(_bits(got), _bits(want))


def _values(flip: bool = False) -> torch.Tensor:
    """Values whose complex64 products round in float16: ties, subnormals, overflow
    (`flip`: in reverse order; the CPU has no flip for complex32). No infinity: the CPU's
    complex add multiplies its second operand by alpha (1 + 0j), so inf + 1j becomes
    inf + nanj there, in complex64 as well."""
    re = torch.tensor([1.0, 3.3, 1e-3, -0.0, 6e-8, 60000.0, 300.0, 2049.0])
    im = torch.tensor([2.0, -4.0, 7.0, 0.5, -6e-8, 9000.0, 1.0, -1.0])
    z = torch.complex(re, im)
    return (z.flip(0) if flip else z).to(C32)


def test_round_trip_is_exact():
    x = _values()
    _same(x.to("pjrt"), x)
    _same(x.reshape(2, 4).t().to("pjrt"), x.reshape(2, 4).t())  # a strided source
    assert x.to("pjrt")[1].item() == x[1].item()
    assert torch.zeros(0, 3, dtype=C32, device="pjrt").cpu().shape == (0, 3)


def test_arithmetic_rounds_each_part_to_float16_as_the_cpu():
    x, y = _values(), _values(flip=True)
    dx, dy = x.to("pjrt"), y.to("pjrt")
    _same(dx * dy, x * y)
    _same(dx + dy, x + y)
    _same(dx * 3, x * 3)
    _same((dx * dy) * dx, (x * y) * x)  # rounded between the two products
    _same(dx.conj().resolve_conj(), x.conj().resolve_conj())


def test_conversions_to_and_from_other_dtypes():
    x = _values()
    d = x.to("pjrt")
    for dtype in (torch.complex64, torch.complex128, torch.float32, torch.float16):
        torch.testing.assert_close(d.to(dtype).cpu(), x.to(dtype), rtol=0, atol=0,
                                   equal_nan=True)
    z = torch.randn(6, dtype=torch.complex64) * 1000
    _same(z.to("pjrt").to(C32), z.to(C32))
    out = torch.empty(6, dtype=C32, device="pjrt")
    out.copy_(z.to("pjrt"))
    _same(out, z.to(C32))


def test_views_share_the_float16_parts():
    x = _values()
    d = x.to("pjrt")
    assert torch.equal(torch.view_as_real(d).cpu(), torch.view_as_real(x))
    assert torch.equal(d.view(torch.float16).cpu(), x.view(torch.float16))
    assert torch.equal(d.view(torch.int32).cpu(), x.view(torch.int32))
    # a write through the float16 view is a write to the complex32 tensor
    torch.view_as_real(d)[2, 1] = 5.0
    torch.view_as_real(x)[2, 1] = 5.0
    _same(d, x)
    # and float16 storage read as complex32
    h = torch.arange(8, dtype=torch.float16)
    _same(h.to("pjrt").view(C32), h.view(C32))


def test_strided_reads_and_writes():
    x = _values().reshape(2, 4)
    d = x.to("pjrt")
    _same(d.t().contiguous(), x.t().contiguous())
    _same(d[:, 1::2] * 2, x[:, 1::2] * 2)
    d[:, ::2] = d[:, 1::2]
    x[:, ::2] = x[:, 1::2]
    _same(d, x)


def test_factories_and_promotion():
    _same(torch.zeros(3, dtype=C32, device="pjrt"), torch.zeros(3, dtype=C32))
    _same(torch.ones(2, 2, dtype=C32, device="pjrt"), torch.ones(2, 2, dtype=C32))
    _same(torch.full((3,), 1.5 - 2j, dtype=C32, device="pjrt"),
          torch.full((3,), 1.5 - 2j, dtype=C32))
    h = torch.randn(4, dtype=torch.float16)
    g = h.flip(0)
    _same(torch.complex(h.to("pjrt"), g.to("pjrt")), torch.complex(h, g))
    # float16 with a complex 0-dim tensor or number promotes to complex32
    _same(h.to("pjrt") + torch.tensor(3 + 1j), h + torch.tensor(3 + 1j))
    _same(h.to("pjrt") * 1j, h * 1j)
    r = torch.randn(1000, dtype=C32, device="pjrt")
    assert r.dtype == C32 and 0.8 < torch.view_as_real(r).float().std().item() * 2**0.5 < 1.2


def test_empty_under_deterministic_algorithms_is_filled_as_on_the_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True)
        try:
            got, want = (torch.empty(3, dtype=C32, device=d) for d in ("pjrt", "cpu"))
        finally:
            torch.use_deterministic_algorithms(False)
    _same(got, want)  # NaN + 0j


def test_under_torch_compile():
    def f(x, y):  # x * y overflows float16 in one part, and is rounded before the add
        return (x * y + x) * 3

    x, y = _values(), _values(flip=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a graph that fell back to eager
        got = torch.compile(f, backend="pjrt", fullgraph=True)(x.to("pjrt"), y.to("pjrt"))
    _same(got, f(x, y))


def test_what_cuda_computes_and_the_cpu_refuses_is_computed():
    """sum, exp, sin... of complex32: the CPU's kernels refuse them and CUDA's compute them
    (eager/refusals.py: CUDA_TAKES), so pjrt computes them, in complex64 rounded to
    complex32 parts; what both refuse (mean) raises the CPU's error."""
    x = _values()[:5]  # (no overflow to infinity)
    wide = x.to(torch.complex64)
    d = x.to("pjrt")
    for name in ("sum", "exp", "sin", "sqrt"):
        got, want = getattr(d, name)().cpu(), getattr(wide, name)().to(C32)
        assert got.dtype == C32  # (XLA's sin(-0 + 0.5j) has a +0 real part: compared as values)
        torch.testing.assert_close(torch.view_as_real(got), torch.view_as_real(want), rtol=0,
                                   atol=0)
    with pytest.raises(NotImplementedError, match="not implemented for 'ComplexHalf'"):
        d.mean()
