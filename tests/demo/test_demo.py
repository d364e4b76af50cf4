"""The main job: `python -m torch_pjrt demo` trains, the loss falls and matches the CPU."""

import re
import subprocess
import sys

import pytest


def _demo(*args: str) -> str:
    cmd = [sys.executable, "-m", "torch_pjrt", "demo", "--steps", "12", "--batch-size", "4",
           "--seq-len", "32", "--sample-bytes", "16", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("mode", ["fused", "strict", "compile"])
def test_demo_trains_and_matches_cpu(mode, tmp_path):
    plot = tmp_path / "loss.png"
    text = _demo("--mode", mode, "--compare-cpu", "--plot", str(plot))
    before, after = map(float, re.search(r"validation loss: ([\d.]+) -> ([\d.]+)", text).groups())
    assert after < before
    diff = float(re.search(r"largest loss difference over \d+ steps: ([\d.e+-]+)", text).group(1))
    assert diff < 1e-3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
