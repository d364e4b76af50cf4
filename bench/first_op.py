"""What a process pays before its first pjrt result, stage by stage, in fresh processes.

    python bench/first_op.py [--processes 5]

Each process times `import torch` (with torch-pjrt's autoload, which imports no JAX),
the start that a first op sets off (`torch_pjrt.ensure_initialized()`: JAX's import, the
PJRT client, the executor and the dispatch tables), the rest of the first op
(`torch.ones(4, device="pjrt")`: its program from a warm compile cache), and a second op
(`.add(1).cpu()`). All processes share one compile cache directory, filled by a first
process that is not counted. Prints the median of each stage over the processes and their range; the
stages a native CPU process also pays (`import torch`) are shown for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torch_pjrt
torch_pjrt.ensure_initialized()
t2 = time.perf_counter()
x = torch.ones(4, device="pjrt")
t3 = time.perf_counter()
y = x.add(1).cpu()
t4 = time.perf_counter()
assert y.tolist() == [2.0] * 4
print("FIRST_OP " + json.dumps({"import torch": t1 - t0, "start (JAX, client, tables)": t2 - t1,
                                "rest of the first op": t3 - t2, "second op": t4 - t3}))
"""

STAGES = ("import torch", "start (JAX, client, tables)", "rest of the first op", "second op")


def run_one(cache: str) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("FIRST_OP "))
    return json.loads(line[len("FIRST_OP "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--processes", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        run_one(cache)  # fills the cache: its op programs, notes and layouts
        runs = [run_one(cache) for _ in range(args.processes)]
    print(f"| stage | median ms | range ms ({args.processes} processes, warm cache) |")
    print("| --- | ---: | ---: |")
    total = []
    for stage in STAGES:
        ms = [r[stage] * 1e3 for r in runs]
        print(f"| {stage} | {statistics.median(ms):.0f} | {min(ms):.0f}-{max(ms):.0f} |")
    for r in runs:
        total.append(sum(r[s] for s in STAGES[1:3]) * 1e3)
    print(f"| first pjrt op after `import torch` | {statistics.median(total):.0f} | "
          f"{min(total):.0f}-{max(total):.0f} |")


if __name__ == "__main__":
    main()
