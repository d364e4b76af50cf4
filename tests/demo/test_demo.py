"""The main job: `python -m torch_pjrt demo` trains, the loss falls and matches the CPU; its
loss curves are drawn by matplotlib (--plot) and its scalars logged for TensorBoard."""

import os
import re
import subprocess
import sys

import pytest

from torch_pjrt.demo import board, plot


def _demo(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch_pjrt", "demo", "--steps", "12", "--batch-size", "4",
           "--seq-len", "32", "--sample-bytes", "16", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _scalars(run_dir) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("mode", ["fused", "strict", "compile"])
def test_demo_trains_and_matches_cpu(mode, tmp_path):
    png, logs = tmp_path / "loss.png", tmp_path / "tb"
    out = _demo("--mode", mode, "--compare-cpu", "--plot", str(png), "--tensorboard", str(logs))
    text = out.stdout
    before, after = map(float, re.search(r"validation loss: ([\d.]+) -> ([\d.]+)", text).groups())
    assert after < before
    diff = float(re.search(r"largest loss difference over \d+ steps: ([\d.e+-]+)", text).group(1))
    assert diff < 1e-3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # stderr is no terminal: a plain progress line every tenth of the run, no redrawn bar
    assert "\r" not in out.stderr and "step 12/12: loss" in out.stderr
    assert sorted(os.listdir(logs)) == ["cpu-eager-fp32", f"pjrt-{mode}-fp32"]
    pjrt, cpu = _scalars(logs / f"pjrt-{mode}-fp32"), _scalars(logs / "cpu-eager-fp32")
    assert len(pjrt["loss/train"]) == len(cpu["loss/train"]) == 12
    assert max(abs(a - b) for a, b in zip(pjrt["loss/train"], cpu["loss/train"])) < 1e-3
    assert pjrt["loss/validation"] == pytest.approx([before, after], abs=1e-3)
    assert pjrt["pjrt/compiles"][-1] + pjrt["pjrt/disk_cache_hits"][-1] > 0
    assert pjrt["memory/allocated_MiB"][-1] > 0 and pjrt["pjrt/syncs"][-1] >= 12
    assert all(v > 0 for v in pjrt["throughput/tokens_per_second"])
    assert "pjrt/compiles" not in cpu  # the backend's metrics: pjrt runs only


@pytest.mark.parametrize("what", [plot, board])
def test_a_missing_optional_package_says_how_to_install_it(what, monkeypatch):
    real = sys.modules["importlib"].util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name in (
        "matplotlib", "tensorboard") else real(name, *a))
    with pytest.raises(SystemExit, match=re.escape(what.INSTALL)):
        what.require()
