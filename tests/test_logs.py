"""The torch_pjrt loggers: compiles, recompiles and CPU fallbacks as logging records (the
application routes, filters and silences them), and TORCH_PJRT_VERBOSE=1, the shortcut that
prints them to stderr."""

import logging
import os
import subprocess
import sys
import warnings

import torch

import torch_pjrt
from torch_pjrt.eager import fallback

HERE = os.path.basename(__file__)


def test_compiles_recompiles_and_fallbacks_are_records_of_the_torch_pjrt_loggers(caplog,
                                                                                 monkeypatch):
    from torch_pjrt.eager import tiers

    monkeypatch.setattr(tiers, "enabled", False)  # the fused graph's own program, compiled
    caplog.set_level(logging.INFO, logger="torch_pjrt")
    with torch_pjrt.set_eager_mode("strict"):
        torch.randn(3, 19).to("pjrt").exp().cpu()  # a shape no other test compiles
        torch.randn(5, 19).to("pjrt").exp().cpu()
    torch.randn(3, 17).to("pjrt").exp().sum().item()  # a fused graph
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback.cpu_fallback(torch.ops.aten.mul.Tensor, (torch.ones(2).to("pjrt"), 2), {})
    said = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert all(level == logging.INFO for _, level, _ in said)

    def of(logger):
        return [m for name, _, m in said if name == logger]

    compiled = of("torch_pjrt.compile")
    assert any("aten.exp.default" in m and f"{HERE}:" in m for m in compiled), said
    assert any(" graph-" in m for m in compiled), said
    assert any("aten.exp.default" in m and "[3, 19] -> float32[5, 19]" in m
               for m in of("torch_pjrt.recompile")), said
    assert any("aten.mul.Tensor ran on the CPU" in m and f"{HERE}:" in m
               for m in of("torch_pjrt.fallback")), said


def test_nothing_is_printed_unless_asked(capsys):
    torch.randn(3, 23).to("pjrt").exp().sum().item()
    assert "torch_pjrt:" not in capsys.readouterr().err


SCRIPT = """
import logging, torch, torch_pjrt
with torch_pjrt.set_eager_mode("strict"):
    torch.randn(3, 29).to("pjrt").exp().cpu()
    logging.getLogger("torch_pjrt").setLevel(logging.WARNING)  # the application silences it
    torch.randn(3, 31).to("pjrt").exp().cpu()
"""


def test_verbose_prints_to_stderr_and_the_application_can_silence_it():
    env = {**os.environ, "TORCH_PJRT_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("torch_pjrt: ")]
    assert any("[3, 29]" in line for line in lines), out.stderr
    assert not any("[3, 31]" in line for line in lines), out.stderr
