"""Test setup: two XLA:CPU devices so pjrt:1 is testable, and the differential helpers."""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import SLOW_TESTS as SLOW  # noqa: E402

import torch_pjrt  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (the multi-dtype OpInfo sweeps) run only with TORCH_PJRT_SLOW_TESTS=1:
    CI runs the fixed OpInfo slice instead (tests/lowering/test_opinfo.py)."""
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow sweep: set TORCH_PJRT_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    """Each test starts from seed 0 and zeroed metrics (tests assert on fallback and
    compile counts, which must not carry over from earlier tests in the process), and
    leaves the eager mode as it found it."""
    from torch_pjrt.eager import modes

    torch.manual_seed(0)
    torch_pjrt.counters.reset()
    mode = modes.get()
    yield
    if modes.get() != mode:  # a later test in this worker would run in the wrong mode
        left = modes.get()
        modes._apply(mode)
        pytest.fail(f"the test left the eager mode {left!r} (was {mode!r}): "
                    "use `with torch_pjrt.set_eager_mode(...)`")


@pytest.fixture(params=["strict", "fused", "debug"])
def eager_mode(request):
    """Run the test once per eager mode (use with pytestmark = usefixtures("eager_mode"))."""
    with torch_pjrt.set_eager_mode(request.param):
        yield request.param
