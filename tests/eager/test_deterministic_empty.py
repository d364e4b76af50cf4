"""torch.empty and friends under torch.use_deterministic_algorithms(True) with
torch.utils.deterministic.fill_uninitialized_memory: NaN for floating and complex dtypes,
the largest value for integers, True for bool, as on the CPU (pjrt's uninitialized memory
otherwise reads as zeros)."""

import warnings

import pytest
import torch
from helpers import assert_same
from torch.testing._internal.common_utils import DeterministicGuard

pytestmark = pytest.mark.usefixtures("eager_mode")

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.int8,
          torch.int32, torch.int64, torch.uint8, torch.uint32, torch.uint64, torch.bool)

FACTORIES = {
    "empty": lambda d, t: torch.empty(4, 3, device=d, dtype=t),
    "empty_like": lambda d, t: torch.empty_like(torch.zeros(4, 3, device=d, dtype=t)),
    "empty_strided": lambda d, t: torch.empty_strided((4, 3), (1, 4), device=d, dtype=t),
    "empty_permuted": lambda d, t: torch.empty_permuted((2, 3, 4), (1, 0, 2), device=d,
                                                        dtype=t),
    "new_empty": lambda d, t: torch.zeros(1, device=d, dtype=t).new_empty((5,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_filled_as_on_cpu(name, dtype):
    with DeterministicGuard(True, fill_uninitialized_memory=True):
        expected = FACTORIES[name]("cpu", dtype)
        actual = FACTORIES[name]("pjrt", dtype)
    if dtype.is_floating_point or dtype.is_complex:  # NaN != NaN: compare where it is
        assert_same(torch.isnan(actual), torch.isnan(expected))
        assert bool(torch.isnan(expected).all())
    else:
        assert_same(actual, expected)


def test_not_filled_without_the_flag():
    with DeterministicGuard(True, fill_uninitialized_memory=False):
        t = torch.empty(3, device="pjrt")
    assert not bool(torch.isnan(t).any())


@pytest.mark.parametrize("dtype", (torch.float32, torch.int64, torch.bool), ids=str)
def test_resize_fills_the_new_elements_as_on_cpu(dtype):
    """resize_ past the storage: the old elements kept, the new ones filled as the CPU's
    deterministic resize_ fills them."""
    results = {}
    for device in ("cpu", "pjrt"):
        with DeterministicGuard(True, fill_uninitialized_memory=True):
            t = torch.arange(6, device=device).to(dtype)
            t.resize_(3, 4)
            results[device] = t
    actual, expected = results["pjrt"], results["cpu"]
    if dtype.is_floating_point:
        assert_same(torch.isnan(actual), torch.isnan(expected))
        assert_same(actual.flatten()[:6], expected.flatten()[:6])
    else:
        assert_same(actual, expected)


ALERTS = {
    # PyTorch's meta functions raise these CUDA kernels' alerts for any meta tensor
    "histc": lambda d: torch.histc(torch.arange(6.0, device=d), bins=3, min=0, max=6),
    "median with indices": lambda d: torch.median(torch.arange(6.0, device=d), 0),
    "mode": lambda d: torch.mode(torch.tensor([1.0, 2.0, 2.0], device=d), 0),
    # an alert of the meta functions that the CPU raises too
    "max_unpool1d": lambda d: torch.nn.functional.max_unpool1d(
        torch.ones(1, 1, 3, device=d), torch.zeros(1, 1, 3, dtype=torch.long, device=d), 1),
}


@pytest.mark.parametrize("warn_only", [False, True])
@pytest.mark.parametrize("name", list(ALERTS))
def test_nondeterminism_alerts_as_on_cpu(name, warn_only):
    """PyTorch's test_nondeterministic_alert_histc and _median: pjrt raised (warned) the
    CUDA kernels' alerts from the meta functions, where the CPU runs deterministically."""
    def alerts(device):
        with DeterministicGuard(True, warn_only=warn_only):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    result = ALERTS[name](device)
                except RuntimeError as e:
                    assert "does not have a deterministic implementation" in str(e), e
                    return "raised", None
        warned = [w for w in caught if "deterministic implementation" in str(w.message)]
        return ("warned" if warned else "quiet"), result

    (expected, cpu), (actual, dev) = alerts("cpu"), alerts("pjrt")
    assert actual == expected, (actual, expected)
    if cpu is not None:
        assert_same(dev, cpu)
