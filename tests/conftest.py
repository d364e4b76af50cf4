"""Test setup: two XLA:CPU devices so pjrt:1 is testable, and the differential helpers."""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import SLOW_TESTS as SLOW  # noqa: E402

import torch_pjrt  # noqa: E402

# The longest test files (multi-process jobs, sweeps), run first: pytest-xdist hands each
# file to the next idle worker in collection order, and a long file taken last leaves the
# other worker idle for its whole length (the tail was 5-11 minutes of a 34-minute run).
LONGEST_FIRST = (
    "lowering/test_opinfo.py", "models/test_hf_zoo.py", "distributed/test_tp.py",
    "runtime/test_compile_cache.py", "distributed/test_demo_parallel.py",
    "lowering/test_error_inputs.py", "distributed/test_collectives.py", "test_resume.py",
    "distributed/test_fsdp.py", "runtime/test_faults_cache.py", "lowering/test_shape.py",
    "eager/test_optimizers.py", "lowering/test_attention.py", "compile/test_backend.py",
    "compile/test_warm_start.py", "amp/test_autocast.py", "distributed/test_ddp.py",
)


def _first(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: tests keep their order within a file).
    Tests marked slow (the multi-dtype OpInfo sweeps) run only with TORCH_PJRT_SLOW_TESTS=1:
    CI runs the fixed OpInfo slice instead (tests/lowering/test_opinfo.py)."""
    items.sort(key=_first)
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
    leaves the eager mode as it found it. Background compiles an earlier test queued are
    dropped, and the finished ones taken into use, before the counters start."""
    from torch_pjrt.eager import graph, modes
    from torch_pjrt.runtime import compile_pool

    compile_pool.cancel()
    if graph._native is not None:
        graph.take_compiled()
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
