"""Convolutions (1d/2d/3d, strided, padded, dilated, grouped, transposed), differential vs CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_same, compare_products, to_device
from opinfo_diff import check_samples, fallbacks_of
from tolerance import assert_as_accurate, assert_within, sum_bound

import torch_pjrt

aten = torch.ops.aten
CONV_OPS = ("convolution",)


def _abs64(tree):
    """Every tensor of `tree` as its absolute value in float64: what a convolution of them
    adds up, the magnitude its rounding is bounded by."""
    return [t.abs().double() if isinstance(t, torch.Tensor) else t for t in tree]


# (spatial size, in, out, kernel, stride, padding, dilation, groups, transposed, output_padding)
CASES = {
    "1d": ((10,), 6, 3, (4,), (3,), (2,), (1,), 3, False, (0,)),
    "2d_odd": ((7, 6), 3, 4, (3, 2), (2, 1), (1, 0), (1, 2), 1, False, (0, 0)),
    "2d_groups": ((8, 9), 4, 6, (3, 3), (2, 3), (1, 1), (2, 1), 2, False, (0, 0)),
    "2d_depthwise": ((5, 5), 4, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, False, (0, 0)),
    "2d_1x1": ((5, 7), 3, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, False, (0, 0)),
    "2d_leftover": ((9, 8), 2, 3, (2, 3), (3, 2), (0, 1), (1, 1), 1, False, (0, 0)),
    "3d": ((5, 6, 4), 2, 4, (2, 3, 1), (1, 2, 1), (0, 1, 0), (2, 1, 1), 2, False, (0, 0, 0)),
    "t1d": ((6,), 3, 2, (3,), (2,), (3,), (1,), 1, True, (1,)),
    "t2d_groups": ((5, 4), 4, 6, (3, 2), (2, 3), (1, 0), (1, 2), 2, True, (1, 2)),
    "t2d_outpad_dilation": ((4, 5), 2, 3, (3, 3), (2, 1), (1, 1), (3, 3), 1, True, (2, 1)),
    "t3d": ((3, 4, 2), 2, 2, (2, 2, 3), (2, 1, 2), (0, 1, 1), (1, 2, 1), 1, True, (1, 0, 0)),
}


def _conv_args(case, batch=2, dtype=torch.float32):
    size, cin, cout, k, s, p, d, g, transposed, op = CASES[case]
    x = torch.randn(batch, cin, *size, dtype=dtype)
    shape = (cin, cout // g) if transposed else (cout, cin // g)
    w = torch.randn(*shape, *k, dtype=dtype)
    b = torch.randn(cout, dtype=dtype)

    def fn(x, w, b):
        return aten.convolution(x, w, b, list(s), list(p), list(d), transposed, list(op), g)

    return fn, x, w, b


@pytest.mark.parametrize("case", sorted(CASES))
def test_convolution_forward_and_grads(case):
    fn, x, w, b = _conv_args(case)
    compare_products(fn, x, w, b)
    assert not fallbacks_of(CONV_OPS)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False),
                                  (False, False, True), (True, True, False)])
@pytest.mark.parametrize("case", ["2d_groups", "t2d_groups"])
def test_convolution_backward_output_mask(case, mask):
    size, cin, cout, k, s, p, d, g, transposed, op = CASES[case]
    fn, x, w, b = _conv_args(case)
    grad = torch.randn_like(fn(x, w, b))
    bias_sizes = [cout] if mask[2] else None
    args = (grad, x, w, bias_sizes, list(s), list(p), list(d), transposed, list(op), g,
            list(mask))
    expected = aten.convolution_backward(*args)
    actual = aten.convolution_backward(*to_device(args))
    magnitudes = aten.convolution_backward(*_abs64(args))
    for a, e, m, wanted in zip(actual, expected, magnitudes, mask):
        if wanted:  # (the CPU's grouped kernels sometimes return masked-out grads too)
            assert_within(a, e, sum_bound(m, e.dtype, terms=x.numel()))
        else:
            assert a is None


def test_transposed_padding_larger_than_kernel_reach():
    # padding > dilation * (kernel - 1): the correlation's padding is negative (a crop).
    x, w = torch.randn(1, 2, 9, 9), torch.randn(2, 3, 3, 3)
    compare_products(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=3), x, w)


def test_functional_convs_without_bias_and_with_string_padding():
    x, w = torch.randn(2, 3, 8, 7), torch.randn(4, 3, 2, 3)
    compare_products(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w)
    compare_products(lambda x, w: F.conv2d(x, w, padding="valid", stride=2), x, w)
    x1, w1 = torch.randn(3, 10), torch.randn(2, 3, 3)  # unbatched 1d
    compare_products(lambda x, w: F.conv1d(x, w, padding=1), x1, w1)


def test_private_convolution_overloads():
    fn, x, w, b = _conv_args("2d_groups")
    s, p, d, g = [2, 3], [1, 1], [2, 1], 2
    for call in (lambda x, w, b: aten._convolution(x, w, b, s, p, d, False, [0, 0], g, False,
                                                   False, True, True),
                 lambda x, w, b: aten._convolution.deprecated(x, w, b, s, p, d, False, [0, 0],
                                                              g, False, False, True)):
        compare_products(call, x, w, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_convolution_dtypes(dtype):
    fn, x, w, b = _conv_args("2d_groups", dtype=dtype)
    compare_products(fn, x, w, b, roundings=len(x) + 1)


def test_empty_batch():
    x, w = torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3)
    assert_same(F.conv2d(*to_device((x, w))), F.conv2d(x, w))


@pytest.mark.parametrize("name", ["nn.functional.conv1d", "nn.functional.conv2d",
                                  "nn.functional.conv3d", "nn.functional.conv_transpose1d",
                                  "nn.functional.conv_transpose2d",
                                  "nn.functional.conv_transpose3d"])
def test_opinfo_samples(name):
    assert check_samples(name, accuracy=True) > 0
    assert not fallbacks_of(CONV_OPS)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d((2, 2)))
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@pytest.mark.usefixtures("eager_mode")
def test_small_cnn_training_steps_match_cpu():
    torch.manual_seed(0)
    model = SmallCNN()
    data = [(torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))) for _ in range(2)]
    results = {}
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    # the reference: the same steps in float64 on the CPU, against which pjrt's float32 is
    # as accurate as the CPU's (tests/tolerance.py)
    for device, dtype in (("cpu", torch.float32), ("pjrt", torch.float32),
                          ("reference", torch.float64)):
        where = "cpu" if device == "reference" else device
        m = copy.deepcopy(model).to(where, dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(m(x.to(where, dtype)), y.to(where))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        results[device] = (torch.stack(losses), m.state_dict())
    for name, value in results["cpu"][1].items():
        actual, reference = results["pjrt"][1][name], results["reference"][1][name]
        assert actual.device.type == "pjrt"
        assert_as_accurate(actual, value, reference, what=name)
    assert_as_accurate(results["pjrt"][0], results["cpu"][0], results["reference"][0],
                       what="losses")
    assert torch_pjrt.metrics()["cpu_fallbacks"] == before
