"""Where a serving step's time goes: vLLM's `LLM` in this process, on pjrt or on the CPU, each
phase of the engine's step timed (scheduling, the runner's host bookkeeping, the model's
forward, the logits, the sampler; on pjrt also the fused graph's keying, the program's run
on the device and the copy of its result), for a batch of `--concurrency` requests.

Runs in the vLLM environment (docs/serving.md), one process per candidate and repeat,
the candidates interleaved:
    .venv-vllm/bin/python bench/serving_steps.py [--repeats 3] [--concurrency 16]
Writes bench/results/serving_steps.json and prints the table of docs/serving.md.
`--no-phases` times nothing inside the step (the phase timers wait for each program, which
takes away async scheduling's overlap): the engine's throughput as it runs, and the CPU
time each generated token costs the process (all its threads).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integrations" / "vllm" / "tests"))
import tiny_models  # noqa: E402

RESULT = "serving_steps result: "
PROMPTS = [p * (1 + i % 3) for i, p in enumerate(tiny_models.PROMPTS * 4)]  # bench/serving.py's

# (label, module, class, method): each call's wall time is added to its label
PHASES = [
    ("engine step", "vllm.v1.engine.core_client", "InprocClient", "get_output"),
    ("schedule", "vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("update from output", "vllm.v1.core.sched.scheduler", "Scheduler",
     "update_from_output"),
    ("runner: execute_model", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "execute_model"),
    ("runner: update states", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_update_states"),
    ("runner: prepare inputs", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_prepare_inputs"),
    ("runner: attention metadata", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_build_attention_metadata"),
    ("runner: model forward", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_model_forward"),
    ("runner: sample_tokens", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "sample_tokens"),
    ("runner: sampler", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
]
PJRT_PHASES = [
    ("pjrt: flush (all)", "torch_pjrt.eager.graph", None, "_flush"),
    ("pjrt: program run (dispatch + device)", "torch_pjrt.eager.graph", None, "run_plan"),
]


def _wrap(owner, name: str, label: str, totals: dict, counts: dict,
          programs: dict | None = None):
    """Times each call of owner.name into totals[label]; `programs`: the call runs a fused
    graph's schedule (graph.run_plan), waited for, and also timed by its ops' count."""
    import functools

    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            if programs is not None:  # the program's run, not only its dispatch
                import jax

                jax.block_until_ready(out)
            return out
        finally:
            seconds = time.perf_counter() - start
            totals[label] += seconds
            counts[label] += 1
            if programs is not None:
                key = f"{len(args[0].pieces)} piece(s), {len(args[4])} ops"
                programs.setdefault(key, [0, 0.0])
                programs[key][0] += 1
                programs[key][1] += seconds

    setattr(owner, name, timed)


def measure(model: str, concurrency: int, output_len: int, platform: str,
            phases_timed: bool = True) -> dict:
    """Runs in the child process: the LLM, a warm-up batch, then the timed batch."""
    import importlib
    import resource

    import torch

    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    phases = PHASES + (PJRT_PHASES if platform == "pjrt" else [])
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=512, max_num_seqs=16,
              max_num_batched_tokens=256, kv_cache_memory_bytes=64 << 20, seed=0)
    programs: dict[str, list] = {}
    for label, module, cls, method in phases if phases_timed else []:
        mod = importlib.import_module(module)
        _wrap(getattr(mod, cls) if cls else mod, method, label, totals, counts,
              programs if label.startswith("pjrt: program") else None)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    llm.generate(prompts, params, use_tqdm=False)  # every step shape once more
    totals.clear()
    counts.clear()
    programs.clear()
    counters = _pjrt_counters()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    out = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
    after = _pjrt_counters()
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    steps = counts["engine step"]
    result = {"platform": platform, "wall_s": wall, "tokens": tokens,
              "tokens_per_s": tokens / wall, "steps": steps,
              "cpu_us_per_token": 1e6 * cpu_s / tokens,
              "async_scheduling": bool(
                  llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
              "torch_threads": torch.get_num_threads(),
              "phases_ms_per_step": {k: 1e3 * v / max(1, steps) for k, v in totals.items()},
              "calls": dict(counts),
              "programs": {k: {"calls": n, "ms_per_call": 1e3 * t / n}
                           for k, (n, t) in programs.items()}}
    if counters is not None:
        result["pjrt"] = {k: after.get(k, 0) - counters.get(k, 0)
                          for k in ("flushes", "compiles", "graph_ops", "graph_ops_pruned",
                                    "cache_hits", "host_to_device_bytes",
                                    "device_to_host_bytes")}
    return result


def _pjrt_counters() -> dict | None:
    if "torch_pjrt" not in sys.modules:
        return None
    import torch_pjrt

    return torch_pjrt.metrics()


def _child(args) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    result = measure(args.model, args.concurrency, args.output_len, args.platform,
                     not args.no_phases)
    print(RESULT + json.dumps(result), flush=True)
    os._exit(0)


def _run(model: Path, platform: str, concurrency: int, output_len: int, cache: str,
         extra_env: dict, no_phases: bool = False) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TORCH_PJRT_CACHE_DIR=cache,
               **extra_env)
    if platform == "cpu":
        env["VLLM_PLUGINS"] = ""
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, "--child", "--platform", platform,
                           "--model", str(model), "--concurrency", str(concurrency),
                           "--output-len", str(output_len),
                           *(["--no-phases"] if no_phases else [])], env=env,
                          capture_output=True,
                          text=True, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
    if line is None:
        raise RuntimeError(f"serving_steps ({platform}) failed:\n{proc.stderr[-4000:]}")
    result = json.loads(line.removeprefix(RESULT))
    result["load_average"] = [load, os.getloadavg()[0]]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--candidates", default="pjrt,cpu",
                        help="pjrt, cpu, pjrt-omp2 (pjrt with OMP_NUM_THREADS=2)")
    parser.add_argument("--out", default=None, help="default: bench/results/"
                        "serving_steps.json (serving_steps_throughput.json with --no-phases)")
    parser.add_argument("--no-phases", action="store_true",
                        help="time no phase inside a step (throughput and CPU time only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--platform", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-serving-steps-"))
    model = tiny_models.write_model("llama", work)
    cache = os.environ.get("TORCH_PJRT_CACHE_DIR") or str(work / "cache")
    envs = {"pjrt": ("pjrt", {}), "cpu": ("cpu", {}),
            "pjrt-omp2": ("pjrt", {"OMP_NUM_THREADS": "2"})}
    names = args.candidates.split(",")
    runs: dict[str, list] = {n: [] for n in names}
    for repeat in range(args.repeats):
        for name in (names if repeat % 2 == 0 else names[::-1]):  # interleaved, both orders
            platform, extra = envs[name]
            runs[name].append(_run(model, platform, args.concurrency, args.output_len,
                                   cache, extra, args.no_phases))
            print(f"{name} repeat {repeat}: {runs[name][-1]['tokens_per_s']:.1f} tokens/s "
                  f"(load {runs[name][-1]['load_average'][0]:.1f})", flush=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "concurrency": args.concurrency,
               "phases_timed": not args.no_phases,
               "output_len": args.output_len, "repeats": args.repeats, "runs": runs}
    out = Path(args.out or ROOT / "bench" / "results" / (
        "serving_steps_throughput.json" if args.no_phases else "serving_steps.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict) -> str:
    """Medians over the repeats: tokens/s, steps, and each phase's ms per step."""
    runs = results["runs"]
    names = list(runs)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    rows = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows.append("| output tokens/s (median) | " + " | ".join(
        f"{med([r['tokens_per_s'] for r in runs[n]]):.1f}" for n in names) + " |")
    rows.append("| CPU time a generated token, µs (median) | " + " | ".join(
        f"{med([r['cpu_us_per_token'] for r in runs[n]]):.0f}"
        if all("cpu_us_per_token" in r for r in runs[n]) else "-" for n in names) + " |")
    rows.append("| load average (min-max) | " + " | ".join(
        f"{min(r['load_average'][0] for r in runs[n]):.1f}-"
        f"{max(r['load_average'][1] for r in runs[n]):.1f}" for n in names) + " |")
    if results.get("phases_timed", True):  # (counted by the phase timers)
        rows.append("| engine steps | " + " | ".join(
            str(runs[n][0]["steps"]) for n in names) + " |")
    labels = list(dict.fromkeys(k for n in names for r in runs[n]
                                for k in r["phases_ms_per_step"]))
    for label in labels:
        cells = []
        for n in names:
            values = [r["phases_ms_per_step"].get(label) for r in runs[n]]
            cells.append("-" if None in values else f"{med(values):.2f}")
        rows.append(f"| {label}, ms/step | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
