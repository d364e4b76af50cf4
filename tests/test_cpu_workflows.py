"""Installing torch-pjrt never breaks a CPU workflow: scripts that never mention pjrt give the
same results with the autoload on as with it off (TORCH_DEVICE_BACKEND_AUTOLOAD=0), and do
not start PJRT. Where they differ by design (torch.accelerator reports pjrt; pinned memory
is pinned), the README says so. Each script runs in a fresh process, as a user's does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import SLOW_TESTS

HERE = os.path.dirname(os.path.abspath(__file__))

CPU_SCRIPT = r"""
import json, sys, warnings
import torch
out = {}
# a CPU training loop
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
x, y = torch.randn(64, 16), torch.randn(64, 4)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
out["eager"] = losses
# torch.compile (Inductor) on CPU tensors
f = torch.compile(lambda a, b: torch.nn.functional.gelu(a @ b).sum(-1))
a, b = torch.randn(8, 8), torch.randn(8, 8)
out["inductor"] = f(a, b).tolist()
# a DataLoader that pins memory, with workers (forked), two epochs
data = torch.utils.data.TensorDataset(torch.arange(32.0).reshape(16, 2))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, num_workers=2)
    out["dataloader"] = [[float(batch[0].sum()) for batch in loader] for _ in range(2)]
out["fork_warnings"] = [str(w.message)[:60] for w in caught if "fork" in str(w.message)]
# nothing above started PJRT (None: torch-pjrt is not loaded)
out["pjrt_started"] = getattr(sys.modules.get("torch_pjrt.runtime"), "_initialized", None)
# nor imported JAX (about 0.6 s of every `import torch`, a third of torch's own import)
out["jax_imported"] = "jax" in sys.modules
# torch.accelerator, the device-agnostic way to pick a device
acc = torch.accelerator.current_accelerator()
device = acc if acc is not None and torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
probe = torch.nn.Linear(4, 1).to(device)
with torch.no_grad():
    out["accelerator"] = [str(acc), float(probe(torch.ones(1, 4, device=device)).sum())]
print("RESULT " + json.dumps(out))
"""


def run(args: list[str], autoload: bool, **env: str) -> dict:
    e = {k: v for k, v in os.environ.items()
         if k not in ("ACCELERATE_TORCH_DEVICE", "XLA_FLAGS") and not k.startswith("PYTEST")}
    e.update(env, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    out = subprocess.run(args, env=e, capture_output=True, text=True, timeout=600, cwd=HERE)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, \
        f"rc {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def test_cpu_script_is_the_same_with_the_autoload_on_and_off():
    on = run([sys.executable, "-c", CPU_SCRIPT], autoload=True)
    off = run([sys.executable, "-c", CPU_SCRIPT], autoload=False)
    for key in ("eager", "inductor", "dataloader"):
        assert on[key] == off[key], key  # bit for bit: the CPU computed it both times
    assert on["fork_warnings"] == off["fork_warnings"] == []
    assert on["pjrt_started"] is False and off["pjrt_started"] is None
    assert on["jax_imported"] is False
    # by design: the accelerator is pjrt, and the probe ran there (to float tolerance)
    assert on["accelerator"][0] == "pjrt" and off["accelerator"][0] == "None"
    assert on["accelerator"][1] == pytest.approx(off["accelerator"][1], rel=1e-6)


@pytest.mark.skipif(not SLOW_TESTS, reason="set TORCH_PJRT_SLOW_TESTS=1 to run it")
def test_trainer_on_the_cpu_is_the_same_with_the_autoload_on_and_off(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    job = [sys.executable, os.path.join(HERE, "integrations", "hf_trainer_job.py")]
    on = run(job + [str(tmp_path / "on"), "--use-cpu"], autoload=True, ACCELERATE_USE_CPU="1")
    off = run(job + [str(tmp_path / "off"), "--use-cpu"], autoload=False)
    assert on["seen"] == off["seen"] == [["cpu", "cpu"]]
    assert on["losses"] == off["losses"] and on["weights"] == off["weights"]
