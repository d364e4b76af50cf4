"""`python -m torch_pjrt` commands: the OpInfo coverage sweep, the error-input sweep and
their reports, info, cache, and a script run under the metrics report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

DEFAULT_OUT = os.path.join("docs", "op-coverage.md")
DEFAULT_ERRORS_OUT = os.path.join("docs", "error-inputs.md")
_CHECKPOINT_EVERY = 20  # ops between partial writes of the JSON (a crash keeps the rest)


def add_ops_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", action="store_true",
                   help=f"write the markdown table and a JSON next to it (--out, default "
                        f"{DEFAULT_OUT}, or {DEFAULT_ERRORS_OUT} with --errors)")
    p.add_argument("--out", default=None, help="markdown path; the JSON gets .json")
    p.add_argument("--errors", action="store_true",
                   help="run the ops' error inputs instead (OpInfo.error_inputs: what the CPU "
                        "rejects, pjrt must reject with the same exception type)")
    p.add_argument("--modes", default=",".join(("strict", "fused", "debug", "compile")),
                   help="with --errors: comma-separated modes (strict, fused, debug, compile)")
    p.add_argument("--ops", default=None,
                   help="comma-separated OpInfo names (name[.variant]); default: all of op_db")
    p.add_argument("--dtype", default="float32", help="sample dtype (default float32)")
    p.add_argument("--time-limit", type=float, default=120.0,
                   help="seconds per op and direction before it counts as failed (0: none)")
    p.add_argument("--max-samples", type=int, default=None,
                   help="at most this many sample inputs per op, evenly spaced (default: all)")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in the JSON and run only the missing ops")


def _json_path(md_path: str) -> str:
    return os.path.splitext(md_path)[0] + ".json"


def _environment(dtype: str) -> dict:
    import jax
    import torch

    return {"torch": torch.__version__, "jax": jax.__version__,
            "platform": jax.default_backend(), "dtype": dtype,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _load_previous(path: str, dtype: str) -> tuple[dict, float]:
    from .conformance import OpResult

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}, 0.0
    if data.get("meta", {}).get("dtype") != dtype:
        return {}, 0.0
    done = {d["name"]: OpResult.from_dict(d) for d in data.get("ops", [])}
    return done, float(data.get("meta", {}).get("seconds", 0.0))


def _write(args, results: list, seconds: float, complete: bool) -> None:
    import torch

    from . import conformance

    dtype = getattr(torch, args.dtype)
    totals = conformance.totals(results, seconds)
    meta = {**_environment(args.dtype), "seconds": round(seconds, 1), "complete": complete,
            "time_limit": args.time_limit, "max_samples": args.max_samples}
    json_path = _json_path(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(json_path + ".tmp", "w") as f:
        json.dump({"meta": meta, "totals": {
            "ops": totals.ops, "autograd_ops": totals.autograd_ops,
            "forward": totals.forward, "backward": totals.backward,
            "forward_pass_percent": round(totals.percent("forward", "pass"), 2),
            "backward_pass_percent": round(totals.percent("backward", "pass"), 2),
        }, "ops": [r.to_dict() for r in results]}, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    if complete:
        header = (f"torch {meta['torch']}, jax {meta['jax']}, platform `{meta['platform']}`, "
                  f"{meta['date']}; per-op time limit {args.time_limit:g} s"
                  + (f", at most {args.max_samples} samples per op" if args.max_samples else "")
                  + ". Raw results: "
                  f"[{os.path.basename(json_path)}]({os.path.basename(json_path)}).")
        with open(args.out, "w") as f:
            f.write(conformance.markdown(results, totals, dtype=dtype, header=header))


def run_ops(args: argparse.Namespace) -> int:
    """Run the sweep; print one line per op, then the totals (and write the report)."""
    import torch

    from . import conformance

    if args.errors:
        return run_errors(args)
    args.out = args.out or DEFAULT_OUT
    # A sweep compiles tens of thousands of one-off programs: keep them off the on-disk
    # compile cache (they would evict a user's useful entries) unless asked for.
    os.environ.setdefault("TORCH_PJRT_COMPILE_CACHE", "0")
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        print(f"ops: unknown dtype {args.dtype!r} (e.g. float32, float64, bfloat16)",
              file=sys.stderr)
        return 2
    names = [n.strip() for n in args.ops.split(",") if n.strip()] if args.ops else None
    try:
        opinfos = conformance.select_ops(names)
    except KeyError as e:
        print(f"ops: {e.args[0]}", file=sys.stderr)
        return 2

    done, previous_seconds = ({}, 0.0)
    if args.resume and args.report:
        done, previous_seconds = _load_previous(_json_path(args.out), args.dtype)
    results = []
    start = time.perf_counter()
    for i, opinfo in enumerate(opinfos, 1):
        name = conformance.op_name(opinfo)
        if name in done:
            results.append(done[name])
            continue
        r = conformance.run_op(opinfo, dtype, time_limit=args.time_limit or None,
                               max_samples=args.max_samples)
        conformance.release_compiled()
        results.append(r)
        print(f"[{i}/{len(opinfos)}] {name}: forward {r.forward.status}, backward "
              f"{r.backward.status} ({r.forward.seconds + r.backward.seconds:.1f} s)"
              + "".join(f"\n    {d}: {o.reason}" for d, o in
                        (("forward", r.forward), ("backward", r.backward))
                        if o.status == "fail"), flush=True)
        if args.report and i % _CHECKPOINT_EVERY == 0:
            _write(args, results, previous_seconds + time.perf_counter() - start, False)
    seconds = previous_seconds + time.perf_counter() - start

    t = conformance.totals(results, seconds)
    verdicts = [(r.name, d, conformance.verdict(r.name, d, r.outcome(d)))
                for r in results for d in conformance.DIRECTIONS]
    print(f"\n{t.ops} ops, {seconds / 60:.1f} min")
    for d in conformance.DIRECTIONS:
        counts = getattr(t, d)
        print(f"{d:>8}: " + ", ".join(f"{counts[s]} {s}" for s in conformance.STATUSES)
              + f"; {t.percent(d, 'pass'):.1f}% pass")
    for label, which in (("unexpected failures (not in the known list)", "unexpected"),
                         ("known failures that pass now (remove them from the list)", "fixed")):
        found = [f"{n} ({d})" for n, d, v in verdicts if v == which]
        if found:
            print(f"{label}: {', '.join(found)}")
    if args.report:
        _write(args, results, seconds, True)
        print(f"wrote {args.out} and {_json_path(args.out)}")
    return 0


def run_errors(args: argparse.Namespace) -> int:
    """The error-input sweep: one line per op, the totals per mode (and the report)."""
    from . import conformance_errors as ce

    os.environ.setdefault("TORCH_PJRT_COMPILE_CACHE", "0")  # one-off programs, as run_ops
    args.out = args.out or DEFAULT_ERRORS_OUT
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ce.MODES]
    names = [n.strip() for n in args.ops.split(",") if n.strip()] if args.ops else None
    try:
        if bad:
            raise KeyError(f"unknown modes {', '.join(bad)}; accepted: {', '.join(ce.MODES)}")
        opinfos = ce.ops_with_error_inputs(names)
    except KeyError as e:
        print(f"ops: {e.args[0]}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    count = len(opinfos)

    def progress(r, i=[0]):  # noqa: B006 - a counter across calls
        i[0] += 1
        fails = "".join(f"\n    {m}: {f}" for m, fs in r.failures.items() for f in fs)
        print(f"[{i[0]}/{count}] {r.name}: {r.inputs} inputs, "
              + ", ".join(f"{m} {r.rejected(m) - r.failed(m)}/{r.rejected(m)}"
                          for m in modes if m in r.counts)
              + (f" ({r.error})" if r.error else "") + f" ({r.seconds:.1f} s){fails}",
              flush=True)

    results = ce.sweep(opinfos, modes, time_limit=args.time_limit or None, on_result=progress)
    seconds = time.perf_counter() - start
    totals = ce.totals(results, modes)
    print(f"\n{len(results)} ops with error inputs, {seconds / 60:.1f} min")
    for m in modes:
        t = totals[m]
        print(f"{m:>8}: {t['rejected']} inputs the CPU rejects, {t['same_type']} same type "
              f"({t['match']} match), {t['other']} other type, {t['silent']} silent")
    if args.report:
        meta = {**_environment("float32"), "seconds": round(seconds, 1), "modes": list(modes)}
        meta.pop("dtype")
        json_path = _json_path(args.out)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump({"meta": meta, "totals": totals,
                       "ops": [r.to_dict() for r in results]}, f, indent=1)
        header = (f"torch {meta['torch']}, jax {meta['jax']}, platform `{meta['platform']}`, "
                  f"{meta['date']}; {seconds / 60:.1f} min. Raw results: "
                  f"[{os.path.basename(json_path)}]({os.path.basename(json_path)}).")
        with open(args.out, "w") as f:
            f.write(ce.markdown(results, modes, header=header))
        print(f"wrote {args.out} and {json_path}")
    unexpected = [f"{r.name}@{m}" for r in results for m in modes
                  if m in r.counts and ce.verdict(r, m) == "unexpected"]
    fixed = [f"{r.name}@{m}" for r in results for m in modes
             if m in r.counts and ce.verdict(r, m) == "fixed"]
    if unexpected:
        print(f"unexpected failures (not in the known list): {', '.join(unexpected)}")
    if fixed:
        print(f"known failures that pass now (remove them from the list): {', '.join(fixed)}")
    return 0


# ------------------------------------------------------------------ info / cache
def run_info(args: argparse.Namespace) -> int:
    import jax
    import torch

    from . import _env
    from .runtime import compile_cache

    print(f"torch-pjrt {__import__('torch_pjrt').__version__}: torch {torch.__version__}, "
          f"jax {jax.__version__}")
    print(f"pjrt devices: {torch.pjrt.device_count()} x {torch.pjrt.get_device_name()}")
    from .eager import modes

    print(f"eager mode: {modes.get()}")
    from .compile import warm

    c = compile_cache.info()
    print(f"compile cache: {c['directory']} ({c['entries']} entries, {c['bytes'] / 1e6:.1f} MB"
          f" of {c['max_bytes'] / 1e9:.1f} GB){'' if c['enabled'] else ' (disabled)'}")
    aot = warm.info()
    print(f"torch.compile (AOTAutograd) cache: {aot['directory']} ({aot['entries']} entries, "
          f"{aot['bytes'] / 1e6:.1f} MB)")
    print("environment:")
    for var in _env.VARIABLES:
        print(f"  {var.name}={_env.get(var.name)!r}")
    return 0


def run_cache(args: argparse.Namespace) -> int:
    """XLA programs (xla/) and torch.compile's AOTAutograd results (aot/), together: an
    AOT entry names programs, so clearing one kind alone would only cost recompiles."""
    from .compile import warm
    from .runtime import compile_cache

    if args.action in ("export", "import"):
        return _ship(args)
    if args.action == "clear":
        print(f"removed {compile_cache.clear()} entries from {compile_cache.directory()}")
        print(f"removed {warm.clear()} entries from {warm.directory()}")
        return 0
    c = compile_cache.info()
    aot = warm.info()
    print(f"directory: {c['directory']}\nenabled: {c['enabled']}\nentries: {c['entries']}\n"
          f"bytes: {c['bytes']}\nmax_bytes: {c['max_bytes']}\nnewest: {c['newest']}\n"
          f"aot directory: {aot['directory']}\naot entries: {aot['entries']}\n"
          f"aot bytes: {aot['bytes']}")
    return 0


def _ship(args: argparse.Namespace) -> int:
    """cache export FILE / cache import FILE (runtime/cache_bundle.py)."""
    from .runtime import cache_bundle, compile_cache

    if not args.file:
        print(f"cache {args.action}: give the file (python -m torch_pjrt cache {args.action} "
              "FILE)", file=sys.stderr)
        return 2
    try:
        if args.action == "export":
            done = cache_bundle.export(args.file)
            print(f"exported {done['files']} files ({done['bytes'] / 1e6:.1f} MB) of "
                  f"{compile_cache.root()} to {args.file}"
                  + (f"; {done['skipped']} damaged or not this user's, left out"
                     if done["skipped"] else ""))
            print("key: " + ", ".join(f"{k}={v}" for k, v in done["key"].items()))
            return 0
        done = cache_bundle.import_(args.file)
    except (cache_bundle.Mismatch, ValueError, RuntimeError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"imported {args.file} into {compile_cache.root()}: {done['added']} entries added, "
          f"{done['present']} already there, {done['notes']} traced-op notes added"
          + (f", {done['rejected']} files rejected" if done["rejected"] else ""))
    for reason in done["reasons"][:10]:
        print(f"  rejected {reason}", file=sys.stderr)
    return 1 if done["rejected"] else 0


# ------------------------------------------------------------------------ report
def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="write the report to this file (default: stderr)")
    p.add_argument("-m", dest="module", action="store_true",
                   help="run a module (like python -m) instead of a script")
    p.add_argument("target", help="the script (or, with -m, the module) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")


def run_target(target: str, argv: list[str], module: bool,
               stop: type[BaseException] | None = None) -> int:
    """Run a script (or, with `module`, a module) as __main__ with these arguments; its
    exit status (1 where it raised; 0 where it raised `stop`, a planned end)."""
    import runpy
    import traceback

    sys.argv = [target, *argv]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        if stop is not None and isinstance(e, stop):
            return 0
        traceback.print_exc()
        return 1
    return 0


def run_report(args: argparse.Namespace) -> int:
    """Run the target as __main__, then write the report (also when it fails)."""
    import torch_pjrt

    status = run_target(args.target, args.args, args.module)
    text = torch_pjrt.metrics.report()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text, file=sys.stderr, end="", flush=True)
    return status
