"""bfloat16 training end to end: the demo's GPT trained on pjrt under bfloat16 autocast
and with bfloat16 parameters follows float32's loss curve (the
CPU's, from the same weights and batches) within a stated tolerance; and the demo's
--precision / --param-dtype flags. (float16 with a GradScaler: test_grad_scaler.py; a
compiled bfloat16 step: test_autocast.py.)"""

import argparse
import re

import pytest
import torch

import torch_pjrt
from torch_pjrt.demo import data as text
from torch_pjrt.demo import train as demo
from torch_pjrt.demo.model import GPT, SIZES, GPTConfig

STEPS = 20
# The largest per-step loss difference to float32 allowed (losses fall from 5.5 to ~3.3
# over these steps), and of the mean over each 10 steps. Measured on 40 steps in fused
# eager: bf16 autocast 0.015 / 0.002, bf16 parameters 0.024 / 0.007, fp16 0.005 / 0.001.
# A step where the CPU's own low-precision run strays further (a batch whose loss spikes:
# Python 3.12's standard library, the demo's text, has one at step 17, where the CPU's
# bf16 autocast is 0.18 off float32) allows CPU_FACTOR times the CPU's own difference.
TOLERANCE = {"step": 0.05, "window": 0.02}
CPU_FACTOR = 2.0

CFG = GPTConfig(**{**SIZES["tiny"].__dict__, "seq_len": 32})


def _losses(device: str, mode: str, precision: str, param_dtype: str) -> list[float]:
    train_data, _ = text.split(text.load(None, 256 << 10))
    torch.manual_seed(0)
    model = GPT(CFG).to(device)
    if param_dtype == "bf16":
        model.to(torch.bfloat16)
    args = argparse.Namespace(seed=0, mode=mode, steps=STEPS, batch_size=8, lr=3e-3,
                              precision=precision, param_dtype=param_dtype)
    if device == "cpu":
        return demo.train(model, train_data, CFG, args, device, progress=False)[0]
    with torch_pjrt.set_eager_mode("strict" if mode == "compile" else mode):
        return demo.train(model, train_data, CFG, args, device, progress=False)[0]


@pytest.fixture(scope="module")
def float32_curve():
    return _losses("cpu", "eager", "fp32", "fp32")


@pytest.mark.parametrize("mode,precision,param_dtype", [
    ("fused", "bf16", "fp32"),
    ("fused", "bf16", "bf16"),
])
def test_loss_curve_follows_float32(float32_curve, mode, precision, param_dtype):
    torch._dynamo.reset()
    losses = _losses("pjrt", mode, precision, param_dtype)
    assert losses[-1] < losses[0] - 1.0  # it trains
    cpu = _losses("cpu", "eager", precision, param_dtype)  # the CPU's own low precision

    def off(curve):  # per step, and the mean of each 10 steps, against float32
        return ([abs(a - b) for a, b in zip(curve, float32_curve)],
                [abs(sum(curve[i:i + 10]) - sum(float32_curve[i:i + 10])) / 10
                 for i in range(0, STEPS, 10)])

    (steps, windows), (cpu_steps, cpu_windows) = off(losses), off(cpu)
    assert all(d < max(TOLERANCE["step"], CPU_FACTOR * c)
               for d, c in zip(steps, cpu_steps)), (steps, cpu_steps)
    assert all(d < max(TOLERANCE["window"], CPU_FACTOR * c)
               for d, c in zip(windows, cpu_windows)), (windows, cpu_windows)
    assert max(steps) > 0  # the low precision is in effect
    assert not torch_pjrt.metrics()["cpu_fallbacks"]


def test_demo_flags(capsys):
    # the training programs are the curve test's (same shapes): already compiled
    argv = ["--steps", "2", "--batch-size", "8", "--seq-len", "32", "--sample-bytes", "2",
            "--precision", "bf16", "--param-dtype", "bf16"]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert "precision=bf16, parameters bfloat16" in out
    assert re.search(r"validation loss: [\d.]+ -> [\d.]+", out)
    with pytest.raises(SystemExit, match="--param-dtype bf16 goes with"):
        demo.main([*argv[:-4], "--precision", "fp16", "--param-dtype", "bf16"])
