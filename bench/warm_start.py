"""Cold and warm start of a compiled GPT training step, each in a fresh process.

    python bench/warm_start.py [--backend pjrt|inductor] [--pairs N]

A pair is two processes on one fresh cache directory (TORCH_PJRT_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR): the first compiles everything (cold), the second finds it
cached (warm). Each reports the time from the first compiled call to the step's loss
on the host (forward, loss, backward, AdamW step) and the time of a later step (what
running the step costs once nothing is left to compile or load); imports are timed
apart. A third process per pair compiles the model with Dynamo's "eager" backend on the
CPU: its first step less a later one is what Dynamo's capture of the model costs, which
any backend's warm start pays (Dynamo keeps nothing on disk). Medians over the pairs;
see docs/compile-cache.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

STEP = r"""
import sys, time
t0 = time.perf_counter()
import torch, torch.nn.functional as F
import torch_pjrt
from torch_pjrt.demo.model import GPT, GPTConfig
backend = sys.argv[1]  # "eager": Dynamo's capture alone (its backend compiles nothing)
dev = "pjrt" if backend == "pjrt" else "cpu"
cfg = GPTConfig(vocab=512, seq_len=128, layers=4, d_model=256, heads=4)
torch.manual_seed(0)
m = GPT(cfg).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
f = torch.compile(m, backend=backend)
x = torch.randint(0, 512, (8, 128)).to(dev)

def step():
    loss = F.cross_entropy(f(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


t1 = time.perf_counter()
step()
t2 = time.perf_counter()
later = []
for _ in range(3):
    t = time.perf_counter()
    step()
    later.append(time.perf_counter() - t)
print("STEP", t2 - t1, "IMPORTS", t1 - t0, "LATER", sorted(later)[1])
"""


def _run(backend: str, cache: str) -> tuple[float, float, float]:
    """(first step, imports, a later step) of one process, in seconds."""
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": cache,
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
    out = subprocess.run([sys.executable, "-c", STEP, backend], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout.split()
    i = out.index("STEP")
    return float(out[i + 1]), float(out[i + 3]), float(out[i + 5])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="pjrt", choices=("pjrt", "inductor"))
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    cold, warm, imports, steps, capture = [], [], [], [], []
    for _ in range(args.pairs):
        with tempfile.TemporaryDirectory() as cache:
            c, i, s = _run(args.backend, cache)
            w, _, s2 = _run(args.backend, cache)
            d, _, s3 = _run("eager", cache)
        cold.append(c)
        warm.append(w)
        imports.append(i)
        steps += [s, s2]
        capture.append(d - s3)
        print(f"cold {c:.2f} s, warm {w:.2f} s, later steps {s:.3f} / {s2:.3f} s; "
              f"Dynamo's capture {d - s3:.2f} s", file=sys.stderr, flush=True)
    c, w, s = statistics.median(cold), statistics.median(warm), statistics.median(steps)
    d = statistics.median(capture)
    print(f"{args.backend}: first compiled step cold {c:.2f} s, warm {w:.2f} s "
          f"({w / c:.0%} of cold; medians of {args.pairs} pairs; imports "
          f"{statistics.median(imports):.2f} s, not counted); a later step {s:.3f} s, so "
          f"compiling cost {c - s:.2f} s cold and {w - s:.2f} s warm ({(w - s) / (c - s):.0%}); "
          f"of the warm cost, Dynamo's own capture of the model is {d:.2f} s "
          f"({d / (c - s):.0%} of the cold cost)")


if __name__ == "__main__":
    main()
