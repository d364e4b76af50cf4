"""A slice of PyTorch's own device-generic tests on pjrt (tools/pytorch_tests.py): the
smaller files and a sample of test_ops, each test against the same test on the CPU. It runs
where TORCH_PJRT_PYTORCH_TESTS names PyTorch's test/ directory (docs/pytorch-tests.md says
how to assemble it; it is not in this repository), and is skipped elsewhere."""

import importlib.util
import json
import os
import pathlib

import pytest

from torch_pjrt import _env

_TOOL = pathlib.Path(__file__).parents[1] / "tools" / "pytorch_tests.py"
TEST_DIR = _env.get("TORCH_PJRT_PYTORCH_TESTS")

pytestmark = pytest.mark.skipif(
    not TEST_DIR or not os.path.isdir(TEST_DIR),
    reason="TORCH_PJRT_PYTORCH_TESTS does not name PyTorch's test/ directory")


def _tool():
    spec = importlib.util.spec_from_file_location("pytorch_tests", _TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
