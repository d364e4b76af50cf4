"""The cost of watching: what observability costs when nobody watches, and with the report on.

    python bench/watching.py [--base REV] [--runs N] [--steps N] [--smoke]

1. Profiling off (with --base REV, the commit before observability): `bench/ops.py` run
   against this tree and against REV, taking turns (base, this, base, this, ...) so that
   the machine's noise hits both alike; the median of each per-op cost over the runs.
2. The report on: the GPT training step (bench/train.py's demo config) in fused eager,
   reading its loss every step (the worst common case: a sync, and its line noted, each
   step), with TORCH_PJRT_METRICS=0 (no lines noted), unset (lines noted) and 1 (lines
   noted, per-step warnings), and inside torch.profiler with the pjrt activity; the
   candidates take turns in one process.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, environment, settle, write_report  # noqa: E402
from train import CONFIGS, LR  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.demo.model import GPT  # noqa: E402
from torch_pjrt.runtime import watch  # noqa: E402


# ------------------------------------------------------------- 1. profiling off
def ops_against(base: str, runs: int) -> dict:
    """{"base"|"this": {op: {mode: median us}}}: bench/ops.py on both trees, in turns."""
    work = tempfile.mkdtemp(prefix="torch_pjrt_base_")
    subprocess.run(f"git -C {ROOT} archive {base} | tar -x -C {work}", shell=True, check=True)
    samples: dict[str, list[dict]] = {"base": [], "this": []}
    script = os.path.join(ROOT, "bench", "ops.py")
    for i in range(runs):
        for label, tree in (("base", work), ("this", ROOT)):
            out = os.path.join(work, f"{label}-{i}.json")
            env = {**os.environ, "PYTHONPATH": tree}
            print(f"[ops] run {i + 1}/{runs}: {label}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, script, "--json", out], env=env, check=True,
                           stdout=subprocess.DEVNULL, timeout=3600)
            with open(out) as f:
                samples[label].append(json.load(f))
    return {label: {op: {mode: statistics.median(run[op][mode] for run in runs_)
                         for mode in runs_[0][op]} for op in runs_[0]}
            for label, runs_ in samples.items()}


# ---------------------------------------------------------------- 2. report on
SETTINGS = {  # candidate -> (watch.notes, watch.loud, under torch.profiler)
    "TORCH_PJRT_METRICS=0": (False, False, False),
    "default (lines noted)": (True, False, False),
    "TORCH_PJRT_METRICS=1": (True, True, False),
    "torch.profiler (CPU + PJRT)": (True, False, True),
}


class Step:
    """The GPT model and AdamW, a step that reads its loss (as training loops log it)."""

    def __init__(self, model: GPT):
        self.model = model.to("pjrt")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)

    def run(self, batches) -> float:
        start = time.perf_counter()
        for x, y in batches:
            loss = F.cross_entropy(self.model(x.to("pjrt")).flatten(0, 1),
                                   y.to("pjrt").flatten())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            loss.item()
        torch.pjrt.synchronize()  # the last step's backward and optimizer step
        return (time.perf_counter() - start) / len(batches)


def report_cost(steps: int, chunk: int, warmup: int) -> dict:
    cfg, batch = CONFIGS["demo"]
    torch.manual_seed(0)
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen),
             torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen))
            for _ in range(chunk)]
    steppers = {name: Step(copy.deepcopy(model)) for name in SETTINGS}
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for round_ in range(warmup + steps // chunk):
        for name, stepper in steppers.items():
            notes, loud, profiled = SETTINGS[name]
            watch.notes, watch.loud = notes, loud
            settle()
            if profiled:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.PJRT]):
                    seconds = stepper.run(data)
            else:
                seconds = stepper.run(data)
            if round_ >= warmup:
                times[name].append(seconds)
    watch.configure()
    base = statistics.median(times["TORCH_PJRT_METRICS=0"])
    return {name: {"median_step_seconds": statistics.median(t),
                   "ratio": statistics.median(t) / base, "step_seconds": t}
            for name, t in times.items()}


def markdown(ops: dict | None, report: dict, args) -> str:
    lines = ["## The cost of watching (`python bench/watching.py`)", ""]
    if ops is not None:
        lines += [f"Profiling off: `bench/ops.py` on this tree and on `{args.base}` (before "
                  f"observability), {args.runs} runs each, taking turns; medians, "
                  "microseconds per op.", "",
                  "| op | mode | base | this | this / base |", "| --- | --- | ---: | ---: | ---: |"]
        for op, modes in ops["this"].items():
            for mode in ("strict", "fused", "debug"):
                b, t = ops["base"][op][mode], modes[mode]
                lines.append(f"| {op} | {mode} | {b:.2f} | {t:.2f} | {t / b:.2f}x |")
        lines.append("")
    lines += [f"The report on: the demo GPT step in fused eager reading its loss each step, "
              f"median of {len(next(iter(report.values()))['step_seconds'])} chunks, "
              "candidates taking turns in one process.", "",
              "| setting | ms per step | ratio |", "| --- | ---: | ---: |"]
    for name, r in report.items():
        lines.append(f"| {name} | {r['median_step_seconds'] * 1e3:.1f} | {r['ratio']:.3f}x |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=None, help="commit to compare bench/ops.py against")
    p.add_argument("--runs", type=int, default=3, help="bench/ops.py runs per tree")
    p.add_argument("--steps", type=int, default=60, help="timed steps per setting")
    p.add_argument("--smoke", action="store_true", help="a few steps, no ops comparison")
    args = p.parse_args()
    torch_pjrt.ensure_initialized()
    ops = ops_against(args.base, args.runs) if args.base and not args.smoke else None
    chunk = 2 if args.smoke else 5
    report = report_cost(chunk if args.smoke else args.steps, chunk, 1 if args.smoke else 2)
    text = markdown(ops, report, args)
    print(text)
    if not args.smoke:
        write_report("watching", {"environment": environment(), "ops": ops, "report": report},
                     text + f"\n\nEnvironment: `{environment()}`")


if __name__ == "__main__":
    main()
