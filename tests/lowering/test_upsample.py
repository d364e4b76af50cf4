"""Upsampling: nearest, nearest-exact, (bi/tri)linear, bicubic, antialiased; vs CPU."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu, assert_same, float64, outputs_and_grads, to_device
from opinfo_diff import check_samples, fallbacks_of

UPSAMPLE_OPS = ("upsample",)


def _check(fn, x):  # (each dtype's elementwise bound: tests/tolerance.py)
    assert_same(outputs_and_grads(fn, to_device(x)), outputs_and_grads(fn, x))
    assert not fallbacks_of(UPSAMPLE_OPS)


X1, X2, X3 = torch.randn(2, 3, 7), torch.randn(2, 3, 5, 7), torch.randn(1, 2, 3, 4, 5)

# Sizes and scale factors that exercise PyTorch's float32 index arithmetic: whole and
# fractional factors, down-sampling, recomputed factors, output 1 (align_corners edge).
NEAREST = {
    "1d_x2": (X1, {"scale_factor": 2}),
    "1d_size_up": (X1, {"size": 11}),
    "1d_size_down": (X1, {"size": 3}),
    "2d_factors": (X2, {"scale_factor": (1.7, 2.3)}),
    "2d_recompute": (X2, {"scale_factor": (1.7, 0.6), "recompute_scale_factor": True}),
    "2d_size": (X2, {"size": (4, 13)}),
    "3d": (X3, {"scale_factor": (2, 1.5, 0.7)}),
    "2d_uint8": (torch.randint(0, 255, (1, 2, 5, 7), dtype=torch.uint8),
                 {"scale_factor": (1.7, 2.3)}),
}


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("case", sorted(NEAREST))
def test_nearest(mode, case):
    x, kw = NEAREST[case]
    _check(lambda x: F.interpolate(x, mode=mode, **kw), x)


SMOOTH = {
    "linear_up": ("linear", X1, {"scale_factor": 2.5}),
    "linear_down": ("linear", X1, {"size": 4}),
    "bilinear_factors": ("bilinear", X2, {"scale_factor": (1.7, 2.3)}),
    "bilinear_size": ("bilinear", X2, {"size": (9, 4)}),
    "bilinear_same_size": ("bilinear", X2, {"size": (5, 7)}),
    "bilinear_to_one": ("bilinear", X2, {"size": (1, 3)}),
    "trilinear": ("trilinear", X3, {"scale_factor": (2, 1.5, 0.7)}),
    "bicubic_up": ("bicubic", X2, {"scale_factor": (1.7, 2.3)}),
    "bicubic_down": ("bicubic", X2, {"size": (3, 4)}),
}


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("case", sorted(SMOOTH))
def test_smooth_interpolation(case, align_corners):
    mode, x, kw = SMOOTH[case]
    _check(lambda x: F.interpolate(x, mode=mode, align_corners=align_corners, **kw), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_dtypes(dtype, mode):
    kw = {} if mode == "nearest" else {"align_corners": False}
    fn = lambda x: F.interpolate(x, scale_factor=(1.7, 2.3), mode=mode, **kw)  # noqa: E731
    x = X2.to(dtype)
    if dtype == torch.bfloat16:  # weighted sums rounded to bfloat16: against float64
        assert_as_accurate_as_cpu(outputs_and_grads(fn, to_device(x)), outputs_and_grads(fn, x),
                                  outputs_and_grads(fn, float64(x)))
    else:
        _check(fn, x)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(5, 7), (8, 40), (17, 9), (1, 1)])
def test_antialias(mode, align_corners, size):
    _check(lambda x: F.interpolate(x, size=size, mode=mode, align_corners=align_corners,
                                   antialias=True), torch.randn(2, 3, 17, 23))


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_uint8_images_bit_exact(mode, align_corners, antialias):
    # uint8 goes through PyTorch's PIL-style fixed-point kernels
    for channels, size in ((3, (6, 9)), (3, (30, 41)), (5, (6, 40)), (1, (17, 5))):
        x = (torch.rand(2, channels, 17, 23) * 255).to(torch.uint8)
        _check(lambda x, size=size: F.interpolate(x, size=size, mode=mode,
                                                  align_corners=align_corners,
                                                  antialias=antialias), x)  # (exact)


@pytest.mark.parametrize("name,variant", [
    ("nn.functional.interpolate", "nearest"), ("nn.functional.interpolate", "nearest-exact"),
    ("nn.functional.interpolate", "linear"), ("nn.functional.interpolate", "bilinear"),
    ("nn.functional.interpolate", "trilinear"), ("nn.functional.interpolate", "bicubic"),
    ("nn.functional.upsample_nearest", ""), ("nn.functional.upsample_bilinear", ""),
    ("_upsample_bilinear2d_aa", "")])
def test_opinfo_samples(name, variant):
    assert check_samples(name, variant, accuracy=True) > 0
    assert not fallbacks_of(UPSAMPLE_OPS)


_GRID_SAMPLER_SHAPES = [  # (input, grid): each refused by one of the CPU kernel's checks
    ((5, 5, 5, 5, 5), (1, 1, 1, 4, 4)), ((5, 5, 5, 5), (1, 1, 4, 4)),
    ((2, 3, 4, 4), (2, 4, 4, 3)), ((2, 3, 0, 4), (2, 4, 4, 2)), ((2, 3, 4), (2, 4, 2)),
    ((2, 3, 4, 4), (2, 4, 4, 2, 1)), ((2, 3, 4, 4, 4), (2, 4, 4, 4, 3)),
]


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("shapes", _GRID_SAMPLER_SHAPES, ids=str)
def test_grid_sampler_2d_refuses_shapes_as_the_cpu(shapes):
    # PyTorch's test_invalid_shapes_grid_sampler: its decomposition unpacked a 5-D input's
    # shape (ValueError) or asserted where the CPU kernel says what is wrong
    args = (torch.rand(shapes[0], dtype=torch.float64),
            torch.rand(shapes[1], dtype=torch.float64) * 2 - 1, 0, 0, True)
    with pytest.raises(RuntimeError) as cpu:
        torch.grid_sampler_2d(*args)
    with pytest.raises(RuntimeError) as dev:
        torch.grid_sampler_2d(*to_device(args))
    assert str(dev.value) == str(cpu.value)
    valid = (torch.rand(2, 2, 3, 4, dtype=torch.float64),
             torch.rand(2, 4, 3, 2, dtype=torch.float64) * 2 - 1)
    assert_same(torch.grid_sampler_2d(*to_device(valid), 0, 0, True),
                torch.grid_sampler_2d(*valid, 0, 0, True))
