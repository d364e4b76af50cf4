"""Max, average and adaptive pooling (values, indices, gradients), differential vs CPU."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu, assert_same, float64, to_device
from opinfo_diff import check_samples, fallbacks_of

POOL_OPS = ("pool",)
NAN, INF = float("nan"), float("inf")


def _run(fn, x, seed=1):
    """fn's outputs and, for float inputs, the input gradient of the first output."""
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    out = fn(x)
    outs = list(out) if isinstance(out, tuple) else [out]
    if x.requires_grad:
        cot = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(seed))
        outs[0].backward(cot.to(outs[0].dtype).to(x.device))
        outs.append(x.grad)
    return outs


def _check(fn, x):  # (each dtype's elementwise bound: tests/tolerance.py)
    assert_same(_run(fn, to_device(x)), _run(fn, x))
    assert not fallbacks_of(POOL_OPS)


X2 = torch.randn(2, 3, 9, 8)
TIES = torch.randint(0, 3, (2, 3, 6, 6)).float()
SPECIAL = torch.randn(1, 2, 6, 6)
SPECIAL[0, 0, 1, 1] = NAN
SPECIAL[0, 0, 4, 2] = NAN
SPECIAL[0, 1, :3, :3] = -INF

MAX_POOLS = {
    "2d": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), X2),
    "2d_ceil_dilation": (lambda x: F.max_pool2d(x, (3, 2), (2, 3), (1, 1), (2, 1),
                                                 ceil_mode=True, return_indices=True), X2),
    "2d_unbatched": (lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randn(3, 7, 5)),
    "2d_ties": (lambda x: F.max_pool2d(x, 3, 1, 1, return_indices=True), TIES),
    "2d_nan_and_-inf": (lambda x: F.max_pool2d(x, 3, 1, 1, return_indices=True), SPECIAL),
    "2d_large_kernel": (lambda x: F.max_pool2d(x, 9, 1, 4, return_indices=True),
                        torch.randn(1, 2, 12, 12)),
    "2d_int64": (lambda x: F.max_pool2d(x, 2, return_indices=True),
                 torch.randint(-5, 5, (2, 3, 6, 6))),
    "1d_ceil": (lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
                torch.randn(2, 3, 10)),
    "3d_ceil": (lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), ceil_mode=True,
                                       return_indices=True), torch.randn(2, 2, 5, 6, 7)),
    "3d_dilation": (lambda x: F.max_pool3d(x, 2, 1, 0, 2, return_indices=True),
                    torch.randn(1, 2, 5, 5, 5)),
}


@pytest.mark.parametrize("case", sorted(MAX_POOLS))
def test_max_pool_values_indices_grads(case):
    fn, x = MAX_POOLS[case]
    _check(fn, x)


AVG_POOLS = {
    "2d": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "2d_ceil_exclude_pad": lambda x: F.avg_pool2d(x, (3, 2), (2, 3), (1, 1), ceil_mode=True,
                                                  count_include_pad=False),
    "2d_ceil_include_pad": lambda x: F.avg_pool2d(x, (3, 2), (2, 3), (1, 1), ceil_mode=True),
    "2d_divisor_override": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "2d_leftover": lambda x: F.avg_pool2d(x, (2, 3), (4, 3)),
}


@pytest.mark.parametrize("case", sorted(AVG_POOLS))
def test_avg_pool2d(case):
    _check(AVG_POOLS[case], X2)


def test_avg_pool_1d_3d_and_integers():
    _check(lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), torch.randn(2, 3, 11))
    _check(lambda x: F.avg_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), ceil_mode=True,
                                  count_include_pad=False), torch.randn(2, 2, 5, 6, 7))
    _check(lambda x: F.avg_pool3d(x, 2, divisor_override=5), torch.randn(1, 2, 4, 4, 4))
    # integer averages truncate, as C++ integer division does
    _check(lambda x: F.avg_pool2d(x, 2, 1, 1), torch.randint(-50, 50, (2, 3, 6, 6)))


@pytest.mark.parametrize("size", [(4, 3), (3, 4), (1, 1), (11, 13), (9, 8)])
def test_adaptive_avg_pool2d(size):
    _check(lambda x: F.adaptive_avg_pool2d(x, size), X2)


def test_adaptive_avg_pool_1d_3d():
    _check(lambda x: F.adaptive_avg_pool1d(x, 4), torch.randn(2, 3, 10))
    _check(lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)), torch.randn(2, 2, 5, 6, 7))


@pytest.mark.parametrize("x", [X2, TIES, SPECIAL], ids=["randn", "ties", "nan_and_-inf"])
def test_adaptive_max_pool2d(x):
    _check(lambda x: F.adaptive_max_pool2d(x, (4, 5), return_indices=True), x)


@pytest.mark.parametrize("size", [(1, 1), (3, 2)])
def test_adaptive_max_pool2d_large_windows(size):
    x = torch.randn(2, 3, 40, 36)
    x[0, 0, 5, 7] = NAN
    _check(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), x)


def test_adaptive_max_pool_1d_3d():
    _check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), torch.randn(2, 3, 10))
    _check(lambda x: F.adaptive_max_pool3d(x, (2, 4, 3), return_indices=True),
           torch.randn(2, 2, 5, 6, 7))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_pool_dtypes(dtype):
    x = X2.to(dtype)
    for fn in (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
               lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: F.adaptive_avg_pool2d(x, (4, 3))):
        if dtype == torch.float64:
            _check(fn, x)
        else:  # averages rounded to bfloat16 (the CPU's kernel sums in it): against float64
            assert_as_accurate_as_cpu(_run(fn, to_device(x)), _run(fn, x), _run(fn, float64(x)))


def test_max_pool_backward_op_with_given_indices():
    x = torch.randn(2, 3, 8, 8)
    out, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    grad = torch.randn_like(out)
    args = (grad, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)
    assert_same(torch.ops.aten.max_pool2d_with_indices_backward(*to_device(args)),
                torch.ops.aten.max_pool2d_with_indices_backward(*args))


def _every(k):
    """A `skip` for check_samples that keeps every k-th sample."""
    seen = [-1]

    def skip(sample):
        seen[0] += 1
        return seen[0] % k != 0

    return skip


# The max-pool OpInfos have 576-1440 samples each (every kernel/stride/padding/dilation/
# ceil_mode combination): every 48th keeps each parameter's variety at a tenth of the time.
_SAMPLE_EVERY = {"nn.functional.max_pool1d": 48, "nn.functional.max_pool2d": 48,
                 "nn.functional.max_pool3d": 48, "max_pool2d_with_indices_backward": 48}


@pytest.mark.parametrize("name", [
    "nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
    "max_pool2d_with_indices_backward", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d",
    "nn.functional.avg_pool3d", "nn.functional.adaptive_avg_pool1d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.adaptive_avg_pool3d",
    "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
    "nn.functional.adaptive_max_pool3d"])
def test_opinfo_samples(name):
    assert check_samples(name, skip=_every(_SAMPLE_EVERY.get(name, 1))) > 0
    assert not fallbacks_of(POOL_OPS)
