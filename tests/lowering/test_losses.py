"""Binary cross entropy (plain and with logits), smooth L1, Huber, soft margin, the margin
losses over classes, CTC's target check, vs CPU."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu, assert_same, float64, to_device
from opinfo_diff import check_samples, fallbacks_of

import torch_pjrt

LOSS_OPS = ("cross_entropy", "l1_loss", "huber", "margin")
REDUCTIONS = ["none", "mean", "sum"]


def _run(fn, x, *rest, seed=1):
    """fn's value and the gradient of its first argument."""
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, *rest)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    out.backward(cot.to(out.dtype).to(out.device))
    return [out, x.grad]


def _check(fn, *args):  # (each dtype's elementwise bound: tests/tolerance.py)
    assert_same(_run(fn, *to_device(args)), _run(fn, *args))
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
    # a mean over bfloat16 terms: as accurate as the CPU against float64 (tests/tolerance.py)
    for fn, args in ((lambda p, y: F.binary_cross_entropy(p, y), (P, Y)),
                     (lambda a, b: F.smooth_l1_loss(a, b), (X, T))):
        low = [t.bfloat16() for t in args]
        assert_as_accurate_as_cpu(_run(fn, *to_device(low)), _run(fn, *low),
                                  _run(fn, *float64(low)))
    assert not fallbacks_of(LOSS_OPS)


@pytest.mark.parametrize("name", [
    "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
    "nn.functional.soft_margin_loss"])
def test_opinfo_samples(name):
    assert check_samples(name) > 0
    assert not fallbacks_of(LOSS_OPS)


# ------------------------------------------------------------------ margin losses over classes
SCORES = torch.randn(3, 5)
LABELS = torch.tensor([[3, 0, -1, 1, 4], [1, 2, 4, 0, -1], [-1, 2, 0, 0, 0]])  # -1 ends a row


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_margin(reduction, p):
    t = torch.tensor([4, 0, 2])
    _check(lambda x, y: F.multi_margin_loss(x, y, p=p, margin=0.7, reduction=reduction),
           SCORES, t)
    _check(lambda x, y, w: F.multi_margin_loss(x, y, p=p, weight=w, reduction=reduction),
           SCORES, t, W)
    _check(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction), SCORES[0], t[:1])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_targets_end_at_minus_one(reduction):
    _check(lambda x, y: F.multilabel_margin_loss(x, y, reduction=reduction), SCORES, LABELS)
    _check(lambda x, y: F.multilabel_margin_loss(x, y, reduction=reduction), SCORES[0],
           LABELS[0])


@pytest.mark.parametrize("mode", ["strict", "fused", "debug", "compile"])
@pytest.mark.parametrize("loss, target, error", [
    (F.multi_margin_loss, torch.tensor([4, 5, 2]), "target out of range"),
    (F.multi_margin_loss, torch.tensor([4, -1, 2]), "target out of range"),
    (F.multi_margin_loss, torch.tensor([4, 1, 2], dtype=torch.int32), "scalar type Long"),
    (F.multilabel_margin_loss, LABELS.clone().index_fill_(1, torch.tensor([4]), 5),
     "'target' is out of range"),
    (F.multilabel_margin_loss, LABELS - 1, "'target' is out of range"),  # -2 after a -1 too
    (F.multilabel_margin_loss, LABELS.int(), "scalar type Long"),
])
def test_margin_losses_check_their_targets(mode, loss, target, error):
    with pytest.raises(RuntimeError, match=error):
        loss(SCORES, target)  # the CPU's error
    x, t = to_device((SCORES, target))
    with pytest.raises(RuntimeError, match=error):
        if mode == "compile":
            torch._dynamo.reset()
            torch.compile(loss, backend="pjrt", fullgraph=True)(x, t).cpu()
        else:
            with torch_pjrt.set_eager_mode(mode):
                loss(x, t).cpu()


def test_margin_losses_compiled_keep_the_cpu_semantics():
    # torch._decomp's decompositions, which torch.compile's tracing ran, count the targets
    # after a -1 (the docs' example: 2.05 for 0.85)
    x, y = torch.tensor([[0.1, 0.2, 0.4, 0.8]]), torch.tensor([[3, 0, -1, 1]])
    torch._dynamo.reset()
    got = torch.compile(F.multilabel_margin_loss, backend="pjrt")(*to_device((x, y)))
    assert_same(got, F.multilabel_margin_loss(x, y))
    _check(torch.compile(F.multilabel_margin_loss, backend="pjrt"), SCORES, LABELS)
    _check(torch.compile(F.multi_margin_loss, backend="pjrt"), SCORES, torch.tensor([4, 0, 2]))


@pytest.mark.parametrize("name", ["nn.functional.multi_margin_loss",
                                  "nn.functional.multilabel_margin_loss"])
def test_margin_opinfo_samples(name):
    assert check_samples(name) > 0
    assert not fallbacks_of(["multi_margin_loss.", "multilabel_margin_loss_forward"])


# ------------------------------------------------------------------ CTC (runs on the CPU)
def test_ctc_targets_outside_the_classes_raise():
    # the CPU's kernel reads log_probs at each target label unchecked (garbage, not an error)
    log_probs = torch.randn(12, 2, 5).log_softmax(2)
    targets = torch.tensor([[1, 2, 3, 0], [4, 4, 1, 9]])  # 9 lies past row 1's length
    lengths = ([12, 12], [3, 3])
    expected = F.ctc_loss(log_probs, targets, *lengths)
    assert_same(F.ctc_loss(*to_device((log_probs, targets)), *lengths), expected)
    for bad in (5, -1):
        t = targets.clone()
        t[1, 0] = bad
        with pytest.raises(RuntimeError, match=f"target {bad} is out of bounds for 5 classes"):
            F.ctc_loss(*to_device((log_probs, t)), *lengths).cpu()


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,target_shape", [((6, 4), (6,)), ((3, 4, 5, 2), (3, 5, 2))])
def test_nll_loss_takes_a_uint8_target(mode, reduction, shape, target_shape):
    # the CPU's kernels take a Byte target; the meta function (a decomposition through
    # gather) refused it: "gather(): Expected dtype int32/int64 for index"
    x = torch.randn(shape)
    t = torch.randint(0, 4, target_shape, dtype=torch.uint8)
    w = torch.rand(4)
    with torch_pjrt.set_eager_mode(mode):
        if len(shape) == 2:
            _check(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), x, t, w)
        else:  # nll_loss2d's CPU kernel refuses it: so does pjrt
            with pytest.raises(RuntimeError, match="expected scalar type Long"):
                F.nll_loss(x, t, w, reduction=reduction)
            with pytest.raises(RuntimeError, match="expected scalar type Long"):
                F.nll_loss(*to_device((x, t, w)), reduction=reduction).cpu()
