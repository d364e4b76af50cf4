"""Binary cross entropy (plain and with logits), smooth L1, Huber, soft margin, vs CPU."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, to_device
from opinfo_diff import check_samples, fallbacks_of

LOSS_OPS = ("cross_entropy", "l1_loss", "huber", "margin")
REDUCTIONS = ["none", "mean", "sum"]


def _run(fn, x, *rest, seed=1):
    """fn's value and the gradient of its first argument."""
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, *rest)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    out.backward(cot.to(out.dtype).to(out.device))
    return [out, x.grad]


def _check(fn, *args, atol=1e-5, rtol=1.3e-6):
    assert_same(_run(fn, *to_device(args)), _run(fn, *args), atol=atol, rtol=rtol)
    assert not fallbacks_of(LOSS_OPS)


X, T = torch.randn(4, 5), torch.randn(4, 5)
P, Y = torch.rand(4, 5).clamp(0.01, 0.99), torch.rand(4, 5)
EDGES = P.clone()
EDGES[0, 0], EDGES[0, 1] = 0.0, 1.0  # log clamped at -100, gradient denominator at 1e-12
W = torch.rand(5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
    _check(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), P, Y)
    _check(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), EDGES, Y)
    _check(lambda p, y, w: F.binary_cross_entropy(p, y, w, reduction=reduction), P, Y,
           W.expand(4, 5).contiguous())


def test_binary_cross_entropy_checks_its_range():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(*to_device((torch.tensor([1.5]), torch.tensor([1.0])))).cpu()
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(*to_device((torch.tensor([0.5]), torch.tensor([-1.0])))).cpu()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(reduction):
    _check(lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), X * 10, Y)
    _check(lambda x, y, w, pw: F.binary_cross_entropy_with_logits(x, y, w, pos_weight=pw,
                                                                  reduction=reduction),
           X * 10, Y, W, torch.rand(5) * 3)


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_smooth_l1_and_huber(reduction, beta):
    _check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), X, T)
    if beta > 0:
        _check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=beta), X, T)


def test_smooth_l1_and_huber_at_branch_boundaries():
    x, t = torch.tensor([0.0, 1.0, -1.0, 0.5, -0.5]), torch.zeros(5)
    for beta in (0.0, 0.5, 1.0):
        _check(lambda a, b, beta=beta: F.smooth_l1_loss(a, b, reduction="none", beta=beta), x, t)
    _check(lambda a, b: F.huber_loss(a, b, reduction="none", delta=0.5), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_margin(reduction):
    _check(lambda a, b: F.soft_margin_loss(a, b, reduction=reduction), X, T.sign())


def test_half_precision():
    _check(lambda p, y: F.binary_cross_entropy(p, y), P.bfloat16(), Y.bfloat16(),
           atol=1e-2, rtol=1e-2)
    _check(lambda a, b: F.smooth_l1_loss(a, b), X.bfloat16(), T.bfloat16(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", [
    "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
    "nn.functional.soft_margin_loss"])
def test_opinfo_samples(name):
    assert check_samples(name) > 0
    assert not fallbacks_of(LOSS_OPS)
