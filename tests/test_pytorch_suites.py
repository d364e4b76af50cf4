"""A slice of PyTorch's own device-generic tests on pjrt (tools/pytorch_tests.py): the
smaller files and a sample of test_ops, each test against the same test on the CPU. It runs
where TORCH_PJRT_PYTORCH_TESTS names PyTorch's test/ directory (docs/pytorch-tests.md says
how to assemble it; it is not in this repository), and is skipped elsewhere."""

import importlib.util
import json
import os
import pathlib
import sys

import pytest

from torch_pjrt import _env

_TOOL = pathlib.Path(__file__).parents[1] / "tools" / "pytorch_tests.py"
TEST_DIR = _env.get("TORCH_PJRT_PYTORCH_TESTS")

needs_test_dir = pytest.mark.skipif(
    not TEST_DIR or not os.path.isdir(TEST_DIR),
    reason="TORCH_PJRT_PYTORCH_TESTS does not name PyTorch's test/ directory")


def _tool():
    spec = importlib.util.spec_from_file_location("pytorch_tests", _TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pytorch_tests", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@needs_test_dir
def test_slice_passes_where_the_cpu_passes(tmp_path):
    tool = _tool()
    present = [f for f in tool.CI_SLICE if (pathlib.Path(TEST_DIR) / f).exists()]
    if not present:
        pytest.skip("none of the slice's files is in TORCH_PJRT_PYTORCH_TESTS")
    out = tmp_path / "outcomes.json"
    results = []
    for name in present:
        tool.main([name, "--pytorch-test-dir", TEST_DIR, "--sample", str(tool.CI_SLICE[name]),
                   "--timeout", "300", "--json", str(out)])
        results += json.loads(out.read_text())
    import pytorch_tests_known as known

    bad = []
    for r in results:
        s = tool.summarize(r, known)
        bad += [f"{r['file']} {t}: {r['pjrt'][t]['outcome']} {r['pjrt'][t]['message']}"
                for t in s["unknown"]]
    assert not bad, "\n".join(bad)


def test_device_only_skips_leave_the_rate():
    tool = _tool()
    import pytorch_tests_known as known

    def o(outcome, message=""):
        return {"outcome": outcome, "message": message, "secs": 0.0, "rss_mb": 0}

    result = {"file": "test_made_up.py", "cpu": {f"T.t{i}": o("passed") for i in range(5)},
              "pjrt": {"T.t0": o("passed"), "T.t1": o("skipped", "Only runs on cpu"),
                       "T.t2": o("skipped", "onlyNativeDeviceTypes: doesn't run on privateuse1"),
                       "T.t3": o("skipped", "requires scipy"), "T.t4": o("failed", "boom")}}
    s = tool.summarize(result, known)
    # t1 and t2 are PyTorch's device-only skips: out of the denominator, counted apart; a
    # skip for another reason (t3) and a failure (t4) stay in it
    assert s["counts"]["device-skip"] == 2 and s["counts"]["skipped"] == 1
    assert (s["passing"], s["cpu_pass"]) == (1, 3)


def test_later_runs_overlay_earlier_ones_test_by_test():
    tool = _tool()

    def o(outcome):
        return {"outcome": outcome, "message": "", "secs": 1.0, "rss_mb": 0}

    whole = {"file": "f.py", "pjrt_secs": 100.0, "pjrt": {"T.a": o("failed"), "T.b": o("passed")},
             "cpu": {"T.a": o("passed"), "T.b": o("passed")}}
    rerun = {"file": "f.py", "pjrt_secs": 2.0, "pjrt": {"T.a": o("passed")},
             "cpu": {"T.a": o("passed")}}
    other = {"file": "g.py", "pjrt_secs": 5.0, "pjrt": {"T.c": o("passed")}, "cpu": {}}
    merged = tool.overlay([whole, rerun, other])
    assert [r["file"] for r in merged] == ["f.py", "g.py"]
    assert merged[0]["pjrt"]["T.a"]["outcome"] == "passed"  # the rerun's outcome
    assert merged[0]["pjrt"]["T.b"]["outcome"] == "passed" and merged[0]["pjrt_secs"] == 100.0
    assert whole["pjrt"]["T.a"]["outcome"] == "failed"  # the inputs are left as they were


NOISY = '''
import sys, unittest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class TestNoisy(TestCase):
    def test_a_warns_a_lot(self, device):
        for _ in range(4000):  # 400 KB, far past a pipe's 64 KB
            sys.stderr.write("a warning a test's ops printed, 100 bytes of it" + "." * 50 + "\\n")

    def test_b_after_it(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)


instantiate_device_type_tests(TestNoisy, globals(), only_for="cpu")
'''


def test_a_worker_that_writes_much_to_stderr_is_not_blocked(tmp_path):
    """A worker's stderr went to a pipe the runner read only at the end: past 64 KB of
    warnings the worker blocked on a write, and the next test ran into its timeout."""
    tool = _tool()
    path = tmp_path / "test_noisy.py"
    path.write_text(NOISY)
    names = ["test_noisy.TestNoisyCPU.test_a_warns_a_lot_cpu",
             "test_noisy.TestNoisyCPU.test_b_after_it_cpu"]
    results = tool.run_tests(path, "cpu", names, timeout=60, max_rss_mb=4096, budget=120)
    assert {t: o.outcome for t, o in results.items()} == dict.fromkeys(names, "passed")
