"""No leaks under load: the demo's training loop in fused eager keeps the device memory
torch-pjrt holds flat after its first steps, and the process's resident memory too.

The long run is a command (its figures are in docs/reliability.md):
    python tests/test_leaks.py --steps 2000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

SOAK = os.path.abspath(__file__)


def _rss() -> int:
    """The process's resident memory, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(steps: int, every: int) -> dict:
    """The demo's training loop (tiny GPT, AdamW, a loss read each step) for `steps` steps
    in fused eager; memory_allocated and RSS after every `every` steps."""
    import torch

    import torch_pjrt
    from torch_pjrt.demo import data as text
    from torch_pjrt.demo.model import GPT, SIZES

    torch.manual_seed(0)
    cfg = SIZES["tiny"]
    train, _ = text.split(text.load(None, max_bytes=1 << 20))
    gen = torch.Generator().manual_seed(1)
    samples = {}
    with torch_pjrt.set_eager_mode("fused"):
        model = GPT(cfg).to("pjrt")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        for step in range(1, steps + 1):
            x, y = text.batch(train, 16, cfg.seq_len, gen)
            _, loss = model(x.to("pjrt"), y.to("pjrt"))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            last = loss.item()
            if step % every == 0:
                gc.collect()
                samples[step] = (torch.pjrt.memory_allocated(), _rss())
    return {"samples": samples, "loss": last, "programs": torch_pjrt.metrics().get("compiles")}


def test_training_loop_memory_stays_flat():
    """150 steps in a fresh process (RSS of this one depends on the tests before it)."""
    out = subprocess.run([sys.executable, SOAK, "--steps", "150", "--every", "25"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    samples = {int(k): v for k, v in result["samples"].items()}
    device = {step: allocated for step, (allocated, _) in samples.items()}
    assert len(set(device.values())) == 1, device  # byte for byte, from step 25 on
    rss = {step: resident for step, (_, resident) in samples.items()}
    assert rss[150] <= rss[50] * 1.05, rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=100)
    args = p.parse_args()
    result = soak(args.steps, args.every)
    for step, (allocated, rss) in result["samples"].items():
        print(f"step {step:5d}: memory_allocated {allocated:,} B, RSS {rss / 2**20:.1f} MiB",
              file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
