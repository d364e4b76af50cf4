"""Training-step time across a zoo of models (bench/zoo_models.py), each candidate against
native CPU eager: Inductor, pjrt strict, fused, and torch.compile(backend="pjrt").

    python bench/models.py [--models gpt,resnet,...] [--rounds N] [--smoke] [--print-only]
    python bench/models.py --first-step     # first-step seconds, cold and warm caches

Per model, every candidate starts from the same weights and reads the same batches from
its own pipeline on its device; they take turns (a chunk of steps each, round after round,
each after bench/common.py's settle pause), so the machine's noise hits them alike.
Reported: the median seconds per step and its ratio to native eager, the geometric mean
of the ratios per candidate and its worst model; the peak memory of a step (pjrt:
torch.pjrt.max_memory_allocated() above what was allocated before the model; native:
peak RSS growth over the same span); the first step's seconds. --smoke (CI): small sizes,
two steps per model and candidate, no Inductor, and the losses must agree with native's.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, settle, write_report  # noqa: E402
from zoo_models import POOL, SPECS, Spec, init_weights  # noqa: E402

import torch_pjrt  # noqa: E402

# name: (device, eager mode, torch.compile backend). The compiled candidate runs the code
# around the compiled model (loss, optimizer) in fused eager.
CANDIDATES = {
    "cpu eager": ("cpu", None, None),
    "cpu inductor": ("cpu", None, "inductor"),
    "pjrt strict": ("pjrt", "strict", None),
    "pjrt fused": ("pjrt", "fused", None),
    "pjrt compile": ("pjrt", "fused", "pjrt"),
}
BASE = "cpu eager"


class Runner:
    """One model with its optimizer and its batches on one device, in one execution mode."""

    def __init__(self, spec: Spec, master: torch.nn.Module, data: dict, candidate: str):
        self.spec = spec
        self.device, self.mode, backend = CANDIDATES[candidate]
        with self.context():
            self.module = copy.deepcopy(master).to(self.device)
            self.forward = self.module if backend is None else \
                torch.compile(self.module, backend=backend)
            self.opt = None if spec.generate else spec.optimizer(list(self.module.parameters()))
            self.data = {k: v.to(self.device) for k, v in data.items()}
        self.steps = 0

    def context(self):
        return torch_pjrt.set_eager_mode(self.mode) if self.mode else contextlib.nullcontext()

    def step(self) -> torch.Tensor:
        batch = {k: v[self.steps % POOL] for k, v in self.data.items()}
        self.steps += 1
        if self.spec.generate:
            with torch.no_grad():
                return self.spec.loss(self.module, self.forward, batch)
        loss = self.spec.loss(self.module, self.forward, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def run(self, steps: int) -> tuple[float, list[float]]:
        """Seconds for these steps (waiting for the device) and their losses."""
        with self.context():
            start = time.perf_counter()
            losses = [self.step() for _ in range(steps)]
            values = [float(x.item()) for x in losses]
            if self.device == "pjrt":
                # the losses are ready before the backward and the optimizer step are: the
                # chunk ends when all of its work has run (the next turn's pause hid it)
                torch.pjrt.synchronize()
            return time.perf_counter() - start, values


# -- memory: device peaks for pjrt, peak RSS growth for native ------------------------------

def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Peak:
    """Bytes a candidate's model, optimizer state, batches and steps hold at their peak."""

    def __init__(self, device: str):
        self.device = device
        _trim()
        if device == "pjrt":
            torch.pjrt.synchronize()
            torch.pjrt.reset_peak_memory_stats()
            self.base = torch.pjrt.memory_allocated()
        else:
            self.base = _proc_kib("VmRSS") * 1024
            with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak RSS (VmHWM) starts again from the current RSS

    def bytes(self) -> int:
        if self.device == "pjrt":
            return torch.pjrt.max_memory_allocated() - self.base
        return _proc_kib("VmHWM") * 1024 - self.base


# -- one model --------------------------------------------------------------------------------

def bench_model(spec: Spec, names: list[str], small: bool, rounds: int, chunk: int,
                warmup: int) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    master = init_weights(spec.build(small))
    data = spec.data(torch.Generator().manual_seed(1), small)
    runners, results = {}, {}
    for name in names:
        print(f"[{spec.name}] warming up {name}...", file=sys.stderr, flush=True)
        peak = Peak(CANDIDATES[name][0])
        start = time.perf_counter()
        runners[name] = Runner(spec, master, data, name)
        first, losses = runners[name].run(1)
        # the remaining warm-up in the timed chunks: fused eager compiles a program per chunk
        rest = sum(runners[name].run(chunk)[0] for _ in range(warmup))
        # the steady state starts once the fused programs compiling in the background
        # (docs/compile-cost.md) are in use; twice: a loop's graph compiles whole once its
        # pieces have run compiled. Every candidate runs these steps, so that all of them
        # have trained as many steps when their losses are compared.
        for _ in range(2 if warmup else 0):
            if CANDIDATES[name][0] == "pjrt":
                torch_pjrt.wait_for_compiles()
            rest += runners[name].run(chunk)[0]
        results[name] = {"first_step_seconds": first, "warmup_seconds": first + rest,
                         "build_seconds": time.perf_counter() - start - first - rest,
                         "peak_bytes": None if name == "cpu inductor" else peak.bytes(),
                         "first_losses": losses, "step_seconds": [], "losses": []}
    for _ in range(rounds):
        for name, runner in runners.items():
            settle()
            seconds, losses = runner.run(chunk)
            results[name]["step_seconds"].append(seconds / chunk)
            results[name]["losses"] = losses
    for r in results.values():
        r["median_step_seconds"] = statistics.median(r["step_seconds"]) \
            if r["step_seconds"] else None
    base = results.get(BASE, {}).get("median_step_seconds")
    for r in results.values():
        r["ratio"] = r["median_step_seconds"] / base if base and r["median_step_seconds"] \
            else None
    runners.clear()
    _trim()
    return {"about": spec.about, "generate": spec.generate, "results": results}


def check_losses(report: dict, rtol: float = 2e-3, atol: float = 1e-4,
                 drift: float = 2e-2) -> list[str]:
    """Where a candidate's losses differ from native eager's: the first steps' within
    float32 roundoff (rtol, atol), the last steps' within `drift`. Training amplifies
    roundoff: the ResNet's losses, equal to 1e-7 for 5 steps, part by 0.8% at step 13 as
    it fits its batches (December 3, CPU eager against pjrt fused, step by step); a wrong
    computation shows at the first step."""
    bad = []
    for model, m in report["models"].items():
        ref = m["results"].get(BASE)
        if ref is None:
            continue
        for name, r in m["results"].items():
            for key, rel, abs_ in (("first_losses", rtol, atol), ("losses", drift, 10 * atol)):
                for a, b in zip(r[key], ref[key]):
                    if not math.isclose(a, b, rel_tol=rel, abs_tol=abs_):
                        bad.append(f"{model} / {name}: loss {a!r} where {BASE} has {b!r}")
    return bad


# -- the report ---------------------------------------------------------------------------------

def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(report: dict) -> dict:
    """Per candidate: the geometric mean of its ratios to native eager, its worst model;
    for the compiled candidate also the ratios to Inductor."""
    out = {}
    models = report["models"]
    for name in report["candidates"]:
        ratios = {k: m["results"][name]["ratio"] for k, m in models.items()
                  if m["results"].get(name, {}).get("ratio")}
        if not ratios:
            continue
        worst = max(ratios, key=ratios.get)
        out[name] = {"geomean": geomean(list(ratios.values())), "worst": worst,
                     "worst_ratio": ratios[worst]}
    if "pjrt compile" in out and "cpu inductor" in out:
        vs = {k: m["results"]["pjrt compile"]["ratio"] / m["results"]["cpu inductor"]["ratio"]
              for k, m in models.items()}
        worst = max(vs, key=vs.get)
        out["pjrt compile / inductor"] = {"geomean": geomean(list(vs.values())),
                                          "worst": worst, "worst_ratio": vs[worst]}
    return out


def _x(v) -> str:
    return f"{v:.2f}x" if v else "-"


def _mb(v) -> str:
    return f"{v / 2**20:.0f}" if v is not None else "-"


def markdown(report: dict) -> str:
    names, models = report["candidates"], report["models"]
    others = [n for n in names if n != BASE]
    lines = ["## The model zoo (`python bench/models.py`)", "",
             "Time per training step (for `generate`: per greedy generate) as a ratio to "
             "native CPU eager, median of the interleaved rounds; "
             f"{report['rounds']} rounds of {report['chunk']} steps after "
             f"{report['warmup']} warm-up chunks; a chunk on pjrt ends when the device has "
             "run all of it (before December 6 it ended when the losses were read, which "
             "left the last backward and optimizer step out). Load average before the run: "
             f"{report['load_before']}, after: {report['load_after']}.", "",
             "| model | native eager ms | " + " | ".join(others) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in others) + " |"]
    for key, m in models.items():
        base = m["results"][BASE]["median_step_seconds"]
        lines.append(f"| {key} | {base * 1e3:.1f} | "
                     + " | ".join(_x(m["results"][n]["ratio"]) for n in others) + " |")
    s = report["summary"]
    lines.append("| **geometric mean** | | "
                 + " | ".join(_x(s.get(n, {}).get("geomean")) for n in others) + " |")
    lines.append("| **worst model** | | " + " | ".join(
        f"{s[n]['worst']} {_x(s[n]['worst_ratio'])}" if n in s else "-" for n in others) + " |")
    if "pjrt compile / inductor" in s:
        c = s["pjrt compile / inductor"]
        lines += ["", f"pjrt compile / Inductor: geometric mean {_x(c['geomean'])}, worst "
                  f"{c['worst']} {_x(c['worst_ratio'])}."]
    for key, m in models.items():
        if m["generate"]:
            r, tokens = m["results"], report["new_tokens"] * report["generate_batch"]
            lines += ["", f"`{key}` tokens/s: " + ", ".join(
                f"{n} {tokens / r[n]['median_step_seconds']:.0f}"
                for n in names if r[n]["median_step_seconds"]) + "."]
    mem = [n for n in names if n != "cpu inductor"]
    lines += ["", "Peak memory of building the model and its first steps, MiB (native eager: "
              "peak RSS growth; pjrt: `torch.pjrt.max_memory_allocated()` growth), and the "
              "ratio to native:", "",
              "| model | " + " | ".join(mem) + " |",
              "| --- | " + " | ".join("---:" for _ in mem) + " |"]
    for key, m in models.items():
        r = m["results"]
        native = r[BASE]["peak_bytes"]
        cells = [_mb(native)] + [
            f"{_mb(r[n]['peak_bytes'])} ({_x(r[n]['peak_bytes'] / native)})"
            if native and r[n]["peak_bytes"] is not None else "-" for n in mem[1:]]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "First step, seconds (compiles included, with the compile caches as this "
              "run found them; `--first-step` measures cold and warm caches):", "",
              "| model | " + " | ".join(names) + " |",
              "| --- | " + " | ".join("---:" for _ in names) + " |"]
    for key, m in models.items():
        lines.append(f"| {key} | " + " | ".join(
            f"{m['results'][n]['first_step_seconds']:.2f}" for n in names) + " |")
    lines += ["", "Models:", ""] + [f"- `{k}`: {m['about']}" for k, m in models.items()]
    lines += ["", f"Environment: `{report['environment']}`"]
    return "\n".join(lines)


# -- first steps with cold and warm compile caches ------------------------------------------

def first_steps(names: list[str], models: list[Spec]) -> dict:
    """Two fresh processes sharing one new cache directory: the first finds it empty."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache,
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
        for state in ("cold", "warm"):
            cmd = [sys.executable, os.path.abspath(__file__), "--first-step-child",
                   "--models", ",".join(s.name for s in models),
                   "--candidates", ",".join(names)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            out[state] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def first_step_child(names: list[str], models: list[Spec]) -> None:
    times = {}
    for spec in models:
        torch.manual_seed(0)
        master = init_weights(spec.build(False))
        data = spec.data(torch.Generator().manual_seed(1), False)
        times[spec.name] = {}
        for name in names:
            start = time.perf_counter()
            runner = Runner(spec, master, data, name)
            runner.run(1)
            times[spec.name][name] = time.perf_counter() - start
            del runner
    print(json.dumps(times))


def first_step_markdown(data: dict, names: list[str]) -> str:
    lines = ["## First step of each zoo model (`python bench/models.py --first-step`)", "",
             "Seconds from building the model on its device to the end of its first step, "
             "in a fresh process with an empty compile cache (cold), then in another that "
             "finds the first one's cache (warm): cold / warm.", "",
             "| model | " + " | ".join(names) + " |",
             "| --- | " + " | ".join("---:" for _ in names) + " |"]
    for model in data["cold"]:
        lines.append(f"| {model} | " + " | ".join(
            f"{data['cold'][model][n]:.1f} / {data['warm'][model][n]:.1f}" for n in names) + " |")
    return "\n".join(lines)


def _load() -> str:
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(s.name for s in SPECS))
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk", type=int, default=2, help="steps per turn")
    # Warm-up covers a whole cycle of the pool and one step more: the batches are views at
    # POOL offsets of one device buffer (the view at offset 0 and those at the others are
    # two programs; before offsets were run-time values each offset compiled its own, and
    # the LSTM's backward, compiled inside the timed rounds, read as 8x).
    p.add_argument("--warmup", type=int, default=3, help="chunks before the timed rounds")
    p.add_argument("--smoke", action="store_true",
                   help="small sizes, 2 steps, no Inductor, losses checked; for CI")
    p.add_argument("--first-step", action="store_true")
    p.add_argument("--first-step-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--print-only", action="store_true",
                   help="print the tables without writing docs/benchmarks.md and bench/results")
    args = p.parse_args()
    names = [n.strip() for n in args.candidates.split(",")]
    wanted = [n.strip() for n in args.models.split(",")]
    models = [s for s in SPECS if s.name in wanted]
    if args.first_step_child:
        return first_step_child(names, models)
    if args.first_step:
        data = first_steps(names, models)
        text = first_step_markdown(data, names)
        print(text)
        if not args.print_only:
            write_report("models-first-step", data, text)
        return
    if args.smoke:
        names = [n for n in names if n != "cpu inductor"]
        args.rounds, args.chunk, args.warmup = 1, 1, 0
    report = {"environment": environment(), "candidates": names, "rounds": args.rounds,
              "chunk": args.chunk, "warmup": args.warmup, "load_before": _load(),
              "models": {}}
    for spec in models:
        report["models"][spec.name] = bench_model(spec, names, args.smoke, args.rounds,
                                                  args.chunk, args.warmup)
    report["load_after"] = _load()
    from zoo_models import NEW_TOKENS
    report["new_tokens"], report["generate_batch"] = NEW_TOKENS, 4
    report["summary"] = summary(report)
    bad = check_losses(report)
    text = markdown(report) if not args.smoke else "\n".join(
        f"{k}: " + ", ".join(f"{n} {m['results'][n]['losses'][-1]:.4f}" for n in names)
        for k, m in report["models"].items())
    print(text)
    if bad:
        sys.exit("losses differ from native eager's:\n" + "\n".join(bad))
    if not (args.smoke or args.print_only):
        write_report("models", report, text)


if __name__ == "__main__":
    main()
