"""Resume exactly: a training run (AdamW, an LR schedule, dropout from the pjrt generator)
saved with torch.save after step k and restored in a new process continues with the
same losses, bit for bit, as the run that went on (with deterministic algorithms, as CUDA
asks); in fused eager and torch.compile."""

import json
import os
import subprocess
import sys

import pytest
import torch

TRAIN = r"""
import json, sys
import torch, torch.nn.functional as F, torch_pjrt

mode, steps, save_at, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# Bit for bit asks for deterministic algorithms, as on CUDA: without them a fused graph's
# first runs may take its ops' own programs while it compiles (docs/compile-cost.md), and
# XLA's fusion may round a last bit differently.
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(32, 4)).to("pjrt")
opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
forward = torch.compile(model, backend="pjrt") if mode == "compile" else model

def restore(rng=True):
    state = torch.load(path, weights_only=True)  # pjrt tensors come back on pjrt
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    if rng:
        torch.pjrt.set_rng_state(state["rng"])
    return state["step"]

def train(start):
    losses = []
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step)  # the data of step `step`
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        loss = F.cross_entropy(forward(x.to("pjrt")), y.to("pjrt"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item().hex())
        if step + 1 == save_at:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "rng": torch.pjrt.get_rng_state(),
                        "step": step + 1}, path)
    return losses

if save_at > 0:  # the run that goes on, saving its state after step `save_at`
    print(json.dumps({"losses": train(0)}))
else:  # a new process: restored from the saved state
    resumed = train(restore())
    torch.pjrt.manual_seed(1)
    other_rng = train(restore(rng=False))  # the same, with other dropout masks
    print(json.dumps({"losses": resumed, "other_rng": other_rng}))
"""


def _train(mode, save_at, path):
    env = {**os.environ, "TORCH_PJRT_EAGER_MODE": "fused"}
    out = subprocess.run([sys.executable, "-c", TRAIN, mode, "6", str(save_at), str(path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["fused", "compile"])
def test_resumed_run_continues_bit_for_bit(tmp_path, mode):
    path = tmp_path / "state.pt"
    on = _train(mode, 3, path)["losses"]
    again = _train(mode, -1, path)
    assert again["losses"] == on[3:]
    assert again["other_rng"] != on[3:]  # dropout's masks matter: the test can fail


def test_rng_state_on_the_device_is_a_type_error():
    """torch.load(map_location="pjrt") puts the saved RNG state on the device: setting it
    raises as on CUDA (it read a device pointer as host memory, a segfault, before)."""
    state = torch.pjrt.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.pjrt.set_rng_state(state.to("pjrt"))
    torch.pjrt.set_rng_state(state.to("pjrt").cpu())
    assert torch.equal(torch.pjrt.get_rng_state(), state)
