"""The installed wheel, run from outside the source tree (.ci/run): every part loads from the
wheel (a file missing from it fails here) and nothing compiles C++ at import."""

import os
import subprocess
import sys
import sysconfig

import torch  # autoload registers the pjrt device

import torch_pjrt
from torch_pjrt.runtime.native import _build_info

site = sysconfig.get_paths()["purelib"]
assert torch_pjrt.__file__.startswith(site), f"not the installed wheel: {torch_pjrt.__file__}"
assert _build_info.TORCH == torch.__version__, (_build_info.TORCH, torch.__version__)

x = torch.randn(4, 8, device="pjrt")
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 1)).to("pjrt")
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
compiled = torch.compile(model, backend="pjrt")
with torch.autocast("pjrt", dtype=torch.bfloat16):
    assert compiled(x).dtype == torch.bfloat16
cpu = model.to("cpu")(x.cpu())
assert torch.allclose(model.to("pjrt")(x).cpu(), cpu, atol=1e-5)

# the command line, and the demo with its optional packages absent (they are extras)
env = {**os.environ, "CXX": "false", "CC": "false"}  # a compiler call would fail
for args in (["info"], ["demo", "--steps", "12", "--batch-size", "4", "--seq-len", "32",
                        "--sample-bytes", "16"], ["demo", "--steps", "1", "--plot", "x.png"]):
    out = subprocess.run([sys.executable, "-m", "torch_pjrt", *args], capture_output=True,
                         text=True, timeout=600, env=env)
    if args[-1] == "x.png":
        assert out.returncode != 0 and "torch-pjrt[plot]" in out.stderr, out.stderr
    else:
        assert out.returncode == 0, out.stdout + out.stderr
print(f"smoke test of the installed wheel: ok ({torch_pjrt.__file__})")
