"""The first minute: seconds from a new process's start to the end of its first training
step, and to the end of its first greedy generate(), each against native CPU eager.

    python bench/first_call.py [--models gpt,hf-llama,...] [--candidates ...] [--rounds N]
                               [--smoke] [--print-only] [--timeout S]

Workloads: every model of the zoo (bench/zoo_models.py; its `generate` entry is a 32-token
greedy generate with a static KV cache, the others a training step), and Hugging Face's
Llama and GPT-2 from configs (no downloads): a training step and a 32-token greedy
`generate()` (the default, dynamic KV cache) each, and for the Llama `transformers`'
continuous batching (`generate_batch`, 3 prompts x 8 new tokens).

Candidates, each in a new process started for that one workload:

- `cpu eager`: native PyTorch on the CPU (TORCH_DEVICE_BACKEND_AUTOLOAD=0);
- `fused cold`: pjrt fused eager on a new, empty TORCH_PJRT_CACHE_DIR;
- `fused warm`: pjrt fused eager, a new process on the directory `fused cold` just filled;
- `compile cold`: `torch.compile(backend="pjrt")` of the model's forward (the rest in fused
  eager) on a new, empty cache directory (and TORCHINDUCTOR_CACHE_DIR).

The clock starts before the process is spawned (interpreter start-up and imports count, as
they do for a user) and stops once the step's loss (the generated tokens) is on the host
and the device is idle. The candidates of one workload run one after the other, and each
ratio divides a candidate's seconds by native CPU eager's of the same round, so that a
loaded machine slows both sides of a ratio alike; with --rounds N the median of the N
ratios is reported. Every candidate's loss (tokens) must equal native's (float32
roundoff). --smoke (CI): small sizes, a few workloads, nothing written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))

CANDIDATES = ("cpu eager", "fused cold", "fused warm", "compile cold")
BASE = "cpu eager"
NEW_TOKENS = 32  # generate(): new tokens in a full run
BATCH_PROMPTS, BATCH_TOKENS = 3, 8  # generate_batch(): prompts, new tokens each


@dataclass(frozen=True)
class Workload:
    """One thing a user runs first: a model and a task (train, generate or batch)."""
    model: str
    task: str  # "train": one training step; "generate": a greedy generate(); "batch":
    #            transformers' generate_batch (continuous batching)
    about: str

    @property
    def key(self) -> str:
        return f"{self.model}/{self.task}"

    def candidates(self, chosen: tuple[str, ...] = CANDIDATES) -> tuple[str, ...]:
        # continuous batching runs its own loop around the model: nothing to torch.compile
        return tuple(c for c in CANDIDATES if c in chosen
                     and not (self.task == "batch" and c == "compile cold"))


def workloads() -> list[Workload]:
    sys.path.insert(0, HERE)
    from zoo_models import SPECS

    out = [Workload(s.name, "generate" if s.generate else "train", s.about) for s in SPECS]
    llama = "Hugging Face LlamaForCausalLM from a config: 4 layers, d=256, 8 heads (2 kv), " \
            "vocab 4096"
    gpt2 = "Hugging Face GPT2LMHeadModel from a config: 4 layers, d=256, 8 heads, vocab 4096"
    out += [Workload("hf-llama", "train", llama + "; batch 4 x 128, AdamW"),
            Workload("hf-llama", "generate", llama + f"; batch 4, a prompt of 16, "
                     f"{NEW_TOKENS} new tokens, dynamic KV cache"),
            Workload("hf-llama", "batch", llama + f"; generate_batch of {BATCH_PROMPTS} "
                     f"prompts (5, 9 and 12 tokens) x {BATCH_TOKENS} new tokens"),
            Workload("hf-gpt2", "train", gpt2 + "; batch 4 x 128, AdamW"),
            Workload("hf-gpt2", "generate", gpt2 + f"; batch 4, a prompt of 16, "
                     f"{NEW_TOKENS} new tokens")]
    return out


SMOKE = ("gpt/train", "generate/generate")  # about 45 s on a quiet 2-core machine


# ------------------------------------------------------------------ the child process
def _hf_model(name: str, small: bool):
    import transformers

    size = dict(vocab_size=96, hidden_size=32, layers=2, heads=4) if small else \
        dict(vocab_size=4096, hidden_size=256, layers=4, heads=8)
    if name == "hf-llama":
        cfg = transformers.LlamaConfig(
            vocab_size=size["vocab_size"], hidden_size=size["hidden_size"],
            num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
            num_key_value_heads=2, intermediate_size=int(2.6875 * size["hidden_size"]),
            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.LlamaForCausalLM(cfg)
    cfg = transformers.GPT2Config(
        vocab_size=size["vocab_size"], n_embd=size["hidden_size"], n_layer=size["layers"],
        n_head=size["heads"], n_positions=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _hf_run(work: Workload, device: str, backend: str | None, small: bool):
    """Build the model and its inputs (the same seeds for every candidate); returns the
    call that runs a step or generate and returns what the parent compares."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    torch.manual_seed(0)
    model = _hf_model(work.model, small)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    model = model.to(device)
    if work.task == "train":
        batch, seq = (2, 8) if small else (4, 128)
        ids = torch.randint(3, vocab, (batch, seq), generator=gen).to(device)
        forward = model if backend is None else torch.compile(model, backend=backend)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            loss = forward(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return [float(loss)]
        return step
    model.eval()
    # no end-of-sequence token: every prompt runs for all its new tokens
    model.generation_config.eos_token_id = None
    if work.task == "batch":
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 9, 12)]
        config = GenerationConfig(max_new_tokens=BATCH_TOKENS, do_sample=False,
                                  eos_token_id=-1, pad_token_id=0)
        # a KV cache sized for this work: left to itself, it sizes its cache from the free
        # memory it finds (off a GPU, without psutil, more than the machine has)
        cache = ContinuousBatchingConfig(page_size=16, num_blocks=16, max_batch_tokens=64,
                                         max_requests_per_batch=BATCH_PROMPTS)

        def batch():
            out = model.generate_batch(inputs=prompts, generation_config=config,
                                       continuous_batching_config=cache)
            return [out[k].generated_tokens for k in sorted(out)]
        return batch
    batch, prompt, new = (1, 4, 4) if small else (4, 16, NEW_TOKENS)
    ids = torch.randint(3, vocab, (batch, prompt), generator=gen).to(device)
    if backend is not None:
        model.forward = torch.compile(model.forward, backend=backend)

    def generate():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=new, min_new_tokens=new, do_sample=False)
        return out.cpu().tolist()
    return generate


def _zoo_run(work: Workload, device: str, backend: str | None, small: bool):
    sys.path.insert(0, HERE)
    import torch
    from zoo_models import SPECS, init_weights

    spec = next(s for s in SPECS if s.name == work.model)
    torch.manual_seed(0)
    module = init_weights(spec.build(small)).to(device)
    batch = {k: v[0].to(device) for k, v in spec.data(torch.Generator().manual_seed(1),
                                                       small).items()}
    forward = module if backend is None else torch.compile(module, backend=backend)
    if spec.generate:
        def generate():
            with torch.no_grad():
                return [float(spec.loss(module, forward, batch))]
        return generate
    opt = spec.optimizer(list(module.parameters()))

    def step():
        loss = spec.loss(module, forward, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return [float(loss)]
    return step


def child(key: str, candidate: str, small: bool, calls: int = 1) -> None:
    """Run one workload in this (new) process (`calls` times: the first call is what is
    timed and compared; the later ones show where the first one's deferred work went) and
    print what it measured, as JSON."""
    t0 = float(os.environ["FIRST_CALL_T0"])
    model, task = key.split("/")
    work = Workload(model, task, "")  # (not workloads(): it imports the zoo, and torch_pjrt)
    import torch

    device = "cpu" if candidate == BASE else "pjrt"
    backend = "pjrt" if candidate.startswith("compile") else None
    if device == "pjrt":
        import torch_pjrt

        torch_pjrt.set_eager_mode("fused")
    if work.model.startswith("hf-"):
        # Python put bench/ first on the path, where kernels.py would shadow the `kernels`
        # package that transformers imports when it is installed.
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
        import transformers  # noqa: F401 - imports count apart from the run
    imported = time.time()
    run = _hf_run if work.model.startswith("hf-") else _zoo_run
    call = run(work, device, backend, small)
    ends = []
    results = []
    for _ in range(calls):
        results.append(call())
        if device == "pjrt":
            torch.pjrt.synchronize()
        ends.append(time.time())
    result = results[0]
    out = {"seconds": ends[0] - t0, "imports": imported - t0, "result": result}
    if calls > 1:
        out["later_calls"] = [b - a for a, b in zip(ends, ends[1:])]
    if device == "pjrt":
        m = torch_pjrt.metrics()
        out["metrics"] = {k: m.get(k, 0) for k in (
            "compiles", "compile_seconds", "disk_cache_hits", "disk_cache_misses",
            "flushes", "recompiles", "aot_cache_hits", "xla_compiles", "xla_compile_seconds",
            "tiered_pieces", "tiered_ops", "host_ops", "background_compiles_queued",
            "background_compiles", "background_compile_seconds", "graph_loops")}
    print("FIRST_CALL " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ the parent
def _spawn(key: str, candidate: str, cache: str, small: bool, timeout: float,
           threads: int | None = None, calls: int = 1) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
    if threads:  # PyTorch's OpenMP / MKL threads (XLA's own pool is left as it is)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env.pop("TORCH_PJRT_METRICS", None)
    if candidate == BASE:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # plain PyTorch: pjrt not registered
    cmd = [sys.executable, os.path.abspath(__file__), "--child", key, "--candidate", candidate,
           "--calls", str(calls)]
    if small:
        cmd.append("--smoke")
    env["FIRST_CALL_T0"] = repr(time.time())
    start = time.time()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIRST_CALL ")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"seconds": None, "error": f"exit {done.returncode} after "
                f"{time.time() - start:.0f} s: " + " | ".join(tail)}
    return json.loads(lines[-1][len("FIRST_CALL "):])


def _bytecode_ready() -> None:
    """torch_pjrt's modules compiled to bytecode, as an installed package has them (pip
    compiles them; PyTorch's are): where PYTHONDONTWRITEBYTECODE is set (the development
    VM) a module edited since its last compile would be compiled from source in every
    new process, 40 ms of the start that no user pays."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("torch_pjrt")
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            compileall.compile_dir(where, quiet=2)  # (a read-only install: as it is)


def run_round(works: list[Workload], small: bool, timeout: float,
              threads: int | None = None, chosen: tuple[str, ...] = CANDIDATES,
              calls: int = 1) -> dict:
    """Every workload once, its candidates back to back."""
    out = {}
    for work in works:
        out[work.key] = {}
        fused = tempfile.mkdtemp(prefix="first-call-")
        try:
            for candidate in work.candidates(chosen):
                cache = fused if candidate.startswith("fused") else \
                    tempfile.mkdtemp(prefix="first-call-")
                r = _spawn(work.key, candidate, cache, small, timeout, threads, calls)
                if cache != fused:
                    shutil.rmtree(cache, ignore_errors=True)
                out[work.key][candidate] = r
                shown = f"{r['seconds']:.1f} s" if r["seconds"] else r["error"]
                if r.get("later_calls"):
                    shown += " (later calls: " + ", ".join(
                        f"{x:.2f}" for x in r["later_calls"]) + " s)"
                print(f"[{work.key}] {candidate}: {shown}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(fused, ignore_errors=True)
    return out


def _same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, list):
            if not _same(x, y):
                return False
        elif isinstance(x, float) or isinstance(y, float):
            if not math.isclose(x, y, rel_tol=2e-3, abs_tol=1e-4):
                return False
        elif x != y:
            return False
    return True


def check(rounds: list[dict]) -> list[str]:
    """Candidates whose result differs from native CPU eager's, and those that failed."""
    bad = []
    for i, r in enumerate(rounds):
        for key, by in r.items():
            ref = by.get(BASE, {}).get("result")
            for name, x in by.items():
                if x["seconds"] is None:
                    bad.append(f"round {i + 1} {key} / {name}: {x['error']}")
                elif ref is not None and not _same(x["result"], ref):
                    bad.append(f"round {i + 1} {key} / {name}: {x['result']!r:.200} where "
                               f"{BASE} has {ref!r:.200}")
    return bad


def summarize(rounds: list[dict]) -> dict:
    """Per workload and candidate: median seconds, and the median of the per-round ratios
    to native CPU eager (with the imports' seconds and the compile counters of the last
    round)."""
    out = {}
    for key in rounds[0]:
        out[key] = {}
        for name in rounds[0][key]:
            runs = [r[key][name] for r in rounds if r[key][name]["seconds"]]
            ratios = [r[key][name]["seconds"] / r[key][BASE]["seconds"] for r in rounds
                      if r[key][name]["seconds"] and r[key][BASE]["seconds"]]
            out[key][name] = {
                "seconds": statistics.median(x["seconds"] for x in runs) if runs else None,
                "imports": statistics.median(x["imports"] for x in runs) if runs else None,
                "ratio": statistics.median(ratios) if ratios else None,
                "metrics": runs[-1].get("metrics") if runs else None,
                "later_calls": runs[-1].get("later_calls") if runs else None,
                "error": None if runs else rounds[-1][key][name].get("error")}
    return out


def _cell(r: dict) -> str:
    if r["seconds"] is None:
        return "failed"
    return f"{r['seconds']:.1f} s ({r['ratio']:.1f}x)" if r["ratio"] else f"{r['seconds']:.1f} s"


def markdown(report: dict) -> str:
    s, names = report["summary"], list(CANDIDATES)
    command = "python bench/first_call.py" + (
        f" --threads {report['threads']}" if report.get("threads") else "")
    lines = [f"## The first minute (`{command}`, {report['environment'].get('date')})", "",
             "Seconds from a new process's start (interpreter start-up and imports counted) "
             "to the end of the first training step, or of the first greedy `generate()`, "
             "and the ratio to native CPU eager measured in the same minutes (median of "
             f"{report['rounds']} round{'s' * (report['rounds'] != 1)}); `fused cold` and "
             "`compile cold` start on an empty compile cache, `fused warm` on the one "
             "`fused cold` just filled."
             + (" Small sizes (--smoke)." if report["smoke"] else "")
             + (f" PyTorch's threads: {report['threads']} (`--threads`)."
                if report.get("threads") else " PyTorch's threads: its default (on a "
                "loaded machine its OpenMP threads wait for each other at every op, which "
                "slows native CPU eager most: HF Llama's first CPU generate took 18.9 s "
                "with 2 threads and 0.8 s with 1 at load average 16; `--threads 1` "
                "compares without that).")
             + f" Load average before the run: {report['load_before']}, after: "
             f"{report['load_after']}.", "",
             "| workload | " + " | ".join(names) + " |",
             "| --- | " + " | ".join("---:" for _ in names) + " |"]
    for key, by in s.items():
        lines.append(f"| {key} | " + " | ".join(_cell(by[n]) if n in by else "-"
                                                for n in names) + " |")
    for task in ("train", "generate"):
        keys = [k for k in s if k.endswith("/" + task)]
        cells = []
        for n in names:
            ratios = [s[k][n]["ratio"] for k in keys if n in s[k] and s[k][n]["ratio"]]
            cells.append(f"{geomean(ratios):.2f}x ({min(ratios):.1f}-{max(ratios):.1f}x)"
                         if ratios else "-")
        if keys:
            lines.append(f"| **geometric mean, {task}** (range) | " + " | ".join(cells) + " |")
    lines += ["", "Imports (seconds from the start to the end of `import torch`, "
              "`torch_pjrt`, `transformers`) and compiles of the first call "
              "(`torch_pjrt.metrics()`: programs compiled by XLA / loaded from the disk cache, "
              "seconds compiling or loading; pieces / ops run op by op (of those ops, how "
              "many on the host), where any; fused programs compiled in the background / "
              "queued by the end of the call, where any):", "",
              "| workload | " + " | ".join(names) + " |",
              "| --- | " + " | ".join("---:" for _ in names) + " |"]
    for key, by in s.items():
        cells = []
        for n in names:
            r = by.get(n)
            if r is None or r["imports"] is None:
                cells.append("-")
                continue
            m = r["metrics"]
            cells.append(f"{r['imports']:.1f} s" + (
                f"; {m['disk_cache_misses']} / {m['disk_cache_hits']}, "
                f"{m['compile_seconds']:.1f} s" if m else "") + (
                f"; {m['tiered_pieces']} / {m['tiered_ops']} op by op"
                if m and m.get("tiered_pieces") else "") + (
                f" ({m['host_ops']} on the host)" if m and m.get("host_ops") else "") + (
                f"; {m['background_compiles']} / {m['background_compiles_queued']} behind"
                if m and m.get("background_compiles_queued") else ""))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    later = [(key, n, by[n]["later_calls"]) for key, by in s.items() for n in names
             if by.get(n) and by[n].get("later_calls")]
    if later:
        lines += ["", "The later calls of the same process (`--calls`), seconds each:", "",
                  "| workload | candidate | later calls |", "| --- | --- | --- |"]
        lines += [f"| {key} | {n} | " + ", ".join(f"{x:.2f}" for x in xs) + " |"
                  for key, n, xs in later]
    lines += ["", "Workloads:", ""] + [f"- `{w['key']}`: {w['about']}"
                                       for w in report["workloads"]]
    lines += ["", f"Environment: `{report['environment']}`"]
    return "\n".join(lines)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _load() -> str:
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None,
                   help="comma-separated models (default: all), e.g. gpt,hf-llama")
    p.add_argument("--tasks", default="train,generate,batch")
    p.add_argument("--candidates", default=",".join(CANDIDATES),
                   help="comma-separated candidates (native CPU eager always runs: the "
                        "ratios divide by it; fused warm needs fused cold)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per process")
    # On a loaded machine PyTorch's OpenMP threads wait for each other at every op: HF
    # Llama's first CPU generate took 18.9 s with 2 threads, 0.8 s with 1 (December 5,
    # load average 16 on 2 cores), which would flatter every ratio to native.
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS / MKL_NUM_THREADS for every process (default: "
                        "PyTorch's own choice); 1 on a loaded machine")
    p.add_argument("--smoke", action="store_true",
                   help="small sizes, two workloads, results checked, nothing written (CI)")
    p.add_argument("--print-only", action="store_true",
                   help="print the tables without writing docs/benchmarks.md and bench/results")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: the tables again from bench/results/first-call.json "
                        "(first-call-threadsN.json with --threads N)")
    p.add_argument("--calls", type=int, default=1,
                   help="calls of the workload per process (default 1): the first is "
                        "timed as above, the later ones' seconds are printed and stored")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--candidate", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.candidate, args.smoke, args.calls)
    sys.path.insert(0, HERE)
    from common import ROOT, environment, write_report

    name = "first-call" + (f"-threads{args.threads}" if args.threads else "")
    if args.report_only:
        with open(os.path.join(ROOT, "bench", "results", f"{name}.json")) as f:
            report = json.load(f)
        text = markdown(report)
        print(text)
        if not args.print_only:
            write_report(name, report, text)
        return
    works = workloads()
    tasks = args.tasks.split(",")
    works = [w for w in works if w.task in tasks
             and (args.models is None or w.model in args.models.split(","))]
    if args.smoke:
        works = [w for w in works if w.key in SMOKE]
    load_before = _load()
    start = time.time()
    chosen = {BASE, *args.candidates.split(",")}
    if "fused warm" in chosen:
        chosen.add("fused cold")
    unknown = chosen - set(CANDIDATES)
    if unknown:
        sys.exit(f"first_call: unknown candidates {sorted(unknown)}; known: {CANDIDATES}")
    _bytecode_ready()
    rounds = [run_round(works, args.smoke, args.timeout, args.threads, tuple(chosen),
                        args.calls) for _ in range(args.rounds)]
    bad = check(rounds)

    report = {"environment": environment(), "rounds": args.rounds, "smoke": args.smoke,
              "threads": args.threads,
              "load_before": load_before, "load_after": _load(),
              "seconds": time.time() - start,
              "workloads": [{"key": w.key, "about": w.about} for w in works],
              "runs": rounds, "summary": summarize(rounds)}
    text = markdown(report)
    print(text)
    if bad:
        sys.exit("first_call: results differ from native CPU eager's, or runs failed:\n"
                 + "\n".join(bad))
    if not (args.smoke or args.print_only):
        write_report(name, report, text)


if __name__ == "__main__":
    main()
