"""Per-op cost of small cached ops on pjrt in each eager mode against native CPU PyTorch.

    python bench/ops.py [--smoke]

strict: one launch per op (dispatch + cache lookup + launch); fused: recording an op
into the pending graph (the graph runs once at the end, not counted); debug: a
synchronous launch. Times are microseconds per op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, interleaved, write_report  # noqa: E402

import torch_pjrt  # noqa: E402

OPS = {
    "add (8)": (lambda a, b, i: a + b, (8,)),
    "mul scalar (8)": (lambda a, b, i: a * 2.5, (8,)),
    "matmul 64x64": (lambda a, b, i: a @ b, (64, 64)),
    "sum (8)": (lambda a, b, i: a.sum(), (8,)),
    "index (8)": (lambda a, b, i: a[i], (8,)),
    "add_ in place (8)": (lambda a, b, i: a.add_(b), (8,)),
}
MODES = ("strict", "fused", "debug")


def _per_op_seconds(fn, args, n: int, mode: str | None) -> float:
    if mode is None:
        start = time.perf_counter()
        for _ in range(n):
            fn(*args)
        return (time.perf_counter() - start) / n
    with torch_pjrt.set_eager_mode(mode):
        torch.pjrt.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn(*args)
        elapsed = time.perf_counter() - start
        torch.pjrt.synchronize()  # the fused graph runs here, outside the timing
    return elapsed / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny counts, for CI")
    p.add_argument("--json", default=None,
                   help="write the microseconds per op to this file instead of the report "
                        "(bench/watching.py compares two commits with it)")
    args = p.parse_args()
    n, rounds = (50, 1) if args.smoke else (2000, 7)
    rows = {}
    for name, (fn, shape) in OPS.items():
        cpu = (torch.randn(shape), torch.randn(shape), torch.tensor([1, 3, 5]))
        dev = tuple(t.to("pjrt") for t in cpu)
        for mode in MODES:  # warm every cache
            _per_op_seconds(fn, dev, 20, mode)
        cands = {"cpu": lambda fn=fn, cpu=cpu: _per_op_seconds(fn, cpu, n, None)}
        for mode in MODES:
            cands[mode] = lambda fn=fn, dev=dev, mode=mode: _per_op_seconds(fn, dev, n, mode)
        rows[name] = {k: v * 1e6 for k, v in interleaved(cands, rounds).items()}
    lines = ["## Per-op cost (`python bench/ops.py`)", "",
             "Microseconds per op, cached, small tensors; ratio to native CPU PyTorch eager.", "",
             "| op | CPU eager | strict | fused (record) | debug | strict / CPU | fused / CPU |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['cpu']:.2f} | {r['strict']:.2f} | {r['fused']:.2f} | "
                     f"{r['debug']:.2f} | {r['strict'] / r['cpu']:.1f}x | "
                     f"{r['fused'] / r['cpu']:.1f}x |")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    elif not args.smoke:
        write_report("ops", {"environment": environment(), "us_per_op": rows},
                     "\n".join(lines + ["", f"Environment: `{environment()}`"]))


if __name__ == "__main__":
    main()
