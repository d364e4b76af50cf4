"""The bounds of tests/tolerance.py pass what rounding does and fail what a wrong kernel
does: each is tried on a correct pjrt result and on a deliberately wrong one."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import compare_products
from tolerance import (
    accuracy_excess,
    assert_as_accurate,
    assert_no_less_accurate,
    assert_within,
    product_magnitudes,
    sum_bound,
)

import torch_pjrt  # noqa: F401

aten = torch.ops.aten


def _conv(x, w, b):
    return aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("wrong", ["flipped kernel", "input one column off", "one tap dropped"])
def test_sum_bound_fails_a_wrong_convolution(dtype, wrong):
    torch.manual_seed(0)
    x, w, b = (torch.randn(3, 3, 12, 12, dtype=dtype), torch.randn(8, 3, 3, 3, dtype=dtype),
               torch.randn(8, dtype=dtype))
    compare_products(_conv, x, w, b, roundings=len(x) + 1)  # the right kernel passes
    magnitude = product_magnitudes(_conv, x, w, b)[0]
    if wrong == "flipped kernel":
        bad = _conv(x.to("pjrt"), w.flip(-1, -2).to("pjrt"), b.to("pjrt"))
    elif wrong == "input one column off":
        bad = _conv(x.roll(1, dims=-1).to("pjrt"), w.to("pjrt"), b.to("pjrt"))
    else:
        dropped = w.clone()
        dropped[:, :, 1, 1] = 0
        bad = _conv(x.to("pjrt"), dropped.to("pjrt"), b.to("pjrt"))
    with pytest.raises(AssertionError, match="differ past the bound"):
        assert_within(bad, _conv(x, w, b), sum_bound(magnitude, dtype, roundings=len(x) + 1,
                                                     terms=x.numel()))


@pytest.mark.parametrize("wrong", ["tanh approximation", "erf in half precision"])
def test_no_less_accurate_fails_a_wrong_gelu(wrong):
    x = torch.linspace(-6, 6, 1001)
    expected, reference = F.gelu(x), F.gelu(x.double())
    assert_no_less_accurate(F.gelu(x.to("pjrt")), expected, reference)
    if wrong == "tanh approximation":
        bad = F.gelu(x.to("pjrt"), approximate="tanh")
    else:
        bad = F.gelu(x.to("pjrt").half()).float()
    with pytest.raises(AssertionError, match="differ past the bound"):
        assert_no_less_accurate(bad, expected, reference)


def test_as_accurate_fails_a_network_with_a_wrong_activation():
    """A small network trained a few steps: the right one passes; the same network with the
    tanh-approximated GELU in place of the exact one, a 1e-3-sized error, fails."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    data = torch.randn(32, 16)

    def trained(model, device, dtype=torch.float32):
        model = copy.deepcopy(model).to(device, dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            model(data.to(device, dtype)).square().mean().backward()
            opt.step()
        return model[2].weight.detach()

    expected, reference = trained(net, "cpu"), trained(net, "cpu", torch.float64)
    right = trained(net, "pjrt")
    assert_as_accurate(right, expected, reference)
    assert accuracy_excess(right, expected, reference) <= 1
    wrong = copy.deepcopy(net)
    wrong[1] = torch.nn.GELU(approximate="tanh")
    wrong = trained(wrong, "pjrt")
    with pytest.raises(AssertionError, match="differ past the bound"):
        assert_as_accurate(wrong, expected, reference)
    assert accuracy_excess(wrong, expected, reference) > 1
