"""Sweep: every case of tests/ecosystem (PEFT, diffusers, timm, torchvision, Lightning) in
every mode it has, on the CPU and on pjrt side by side; writes what each gave.

    python tools/ecosystem_sweep.py                  # every library installed here
    python tools/ecosystem_sweep.py timm --modes fused
    python tools/ecosystem_sweep.py --report         # and write docs/ecosystem.{json,md}

A case passes when every compared quantity (outputs, first-step gradients, each step's loss,
the parameters after the optimizer steps) is within what it is allowed: a training case's
float32 run as accurate as the CPU's against a float64 run (tests/ecosystem/differential.py),
another case's within its tolerance of the CPU's, relative to the CPU value's largest
magnitude. A training case that is not passes as "rounding" when its outputs are and the
float64 runs of both devices agree (the lowerings are right; the model amplifies float32's
rounding); otherwise it differs (by the worst figure: the error over the error allowed) or
raises (the error's first line). CPU fallbacks are counted per op. docs/ecosystem.json keeps
one run per torch version (a run replaces, for the libraries it swept under its torch
version, the records of the modes and cases it ran),
and docs/ecosystem.md's sweep section is drawn from all of them; the rest of that page is
left as it is.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import pathlib
import platform
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests" / "ecosystem"
JSON = ROOT / "docs" / "ecosystem.json"
MARKDOWN = ROOT / "docs" / "ecosystem.md"
BEGIN, END = "<!-- ecosystem-sweep: begin -->", "<!-- ecosystem-sweep: end -->"

# test module -> the distribution whose version the report names
LIBRARIES = {"peft": "peft", "diffusers": "diffusers", "timm": "timm",
             "torchvision": "torchvision", "lightning": "lightning"}
MODE_ORDER = ("fused", "strict", "compile")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _error_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def run_library(name: str, modes: tuple[str, ...], only: str | None,
                after_each=lambda data: None, done: list | None = None) -> dict:
    """Every case of tests/ecosystem/test_<name>.py in `modes`: one record each
    (`after_each` sees the library's records so far after each case)."""
    import torch_pjrt

    try:
        module = importlib.import_module(f"test_{name}")
    except BaseException as exc:  # pytest.importorskip's Skipped, or an import error
        return {"version": _version(LIBRARIES[name]), "skipped": _error_line(exc), "cases": []}
    records = list(done or [])
    data = {"version": _version(LIBRARIES[name]), "cases": records}
    finished = {(r["case"], r["mode"]) for r in records}
    for (case, mode), run in module.CASES.items():
        if mode not in modes or (only and only not in case) or (case, mode) in finished:
            continue
        before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
        start = time.perf_counter()
        record = {"case": case, "mode": mode}
        try:
            result = run()
            worst = result.worst
            record.update(status=result.verdict, worst=worst.what, excess=worst.excess,
                          relative=worst.relative, max_abs=worst.max_abs,
                          tolerance=result.tolerance)
            if result.float64 is not None:
                record["float64"] = {"worst": result.float64.worst.what,
                                     "relative": result.float64.worst.relative}
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            record.update(status="error", error=_error_line(exc))
            if "PJRT_SWEEP_TRACE" in __import__("os").environ:
                traceback.print_exc()
        after = torch_pjrt.metrics()["cpu_fallbacks"]
        record["fallbacks"] = {op: n - before.get(op, 0) for op, n in after.items()
                               if n > before.get(op, 0)}
        record["seconds"] = round(time.perf_counter() - start, 1)
        records.append(record)
        print(_line(name, record), flush=True)
        after_each(data)
    return data


def _result_text(r: dict) -> str:
    if r["status"] == "pass":
        text = "pass"
    elif r["status"] == "rounding":
        text = (f"pass, rounding: float32 {r['excess']:.2g}x allowed ({r['worst']}); "
                f"float64 runs agree to {r['float64']['relative']:.1g}")
    elif r["status"] == "differs" and "excess" in r:
        text = f"differs {r['excess']:.2g}x allowed ({r['worst']}, {r['relative']:.2g})"
        if "float64" in r:
            text += f"; float64 {r['float64']['relative']:.2g} ({r['float64']['worst']})"
    elif r["status"] == "differs":
        text = f"differs {r['relative']:.2g} ({r['worst']})"
    else:
        text = f"error: {r['error']}"
    if r["fallbacks"]:
        text += " · fallbacks " + ", ".join(
            f"{op} x{n}" for op, n in sorted(r["fallbacks"].items()))
    return text


def _line(name: str, r: dict) -> str:
    return f"{name:12s} {r['case']:40s} {r['mode']:8s} {r['seconds']:6.1f}s  {_result_text(r)}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(runs: dict) -> str:
    """The sweep section of docs/ecosystem.md from every recorded run."""
    out = [BEGIN, "", "## Library sweep", "",
           "Generated by `python tools/ecosystem_sweep.py --report` (one run per torch "
           "version, each in its own environment); do not edit by hand. A case passes when "
           "its outputs, first-step gradients, losses and final parameters are each within "
           "what they are allowed: a training case's float32 run as accurate as the CPU's "
           "against a float64 run of the same model (\"rounding\": not, but the outputs are "
           "and both devices' float64 runs agree, so the lowerings are right and the model "
           "amplifies float32's rounding), other cases within their tolerance of the CPU's, "
           "relative to the largest CPU value of that quantity. "
           "Fallbacks: ops run on the CPU (counted, `torch_pjrt.metrics()`).", "",
           "| library | version | torch | JAX | Python | fused | strict | compile | date |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for torch_version, run in sorted(runs.items()):
        for lib, data in run["libraries"].items():
            if data.get("skipped"):
                out.append(f"| {lib} | {data['version'] or 'not installed'} | {torch_version} "
                           f"| {run['jax']} | {run['python']} | skipped: "
                           f"{_cell(data['skipped'][:80])} | | | {run['date']} |")
                continue
            counts = []
            for mode in MODE_ORDER:
                rs = [r for r in data["cases"] if r["mode"] == mode]
                passed = sum(r["status"] in ("pass", "rounding") for r in rs)
                rounding = sum(r["status"] == "rounding" for r in rs)
                counts.append((f"{passed}/{len(rs)}" + (f" ({rounding} rounding)" if rounding
                                                         else "")) if rs else "")
            out.append(f"| {lib} | {data['version']} | {torch_version} | {run['jax']} | "
                       f"{run['python']} | " + " | ".join(counts) + f" | {run['date']} |")
    for torch_version, run in sorted(runs.items()):
        for lib, data in run["libraries"].items():
            if not data["cases"]:
                continue
            out += ["", f"### {lib} {data['version']}, torch {torch_version}", "",
                    "| case | " + " | ".join(MODE_ORDER) + " |",
                    "| --- |" + " --- |" * len(MODE_ORDER)]
            cases: dict[str, dict] = {}
            for r in data["cases"]:
                cases.setdefault(r["case"], {})[r["mode"]] = r
            for case, by_mode in cases.items():
                cells = [_cell(_result_text(by_mode[m])) + f" ({by_mode[m]['seconds']:.0f} s)"
                         if m in by_mode else "" for m in MODE_ORDER]
                out.append(f"| {case} | " + " | ".join(cells) + " |")
    out += ["", END]
    return "\n".join(out)


def write_report(run: dict | None) -> None:
    """Add `run` to docs/ecosystem.json (None: add nothing) and redraw the page's section."""
    runs = json.loads(JSON.read_text())["runs"] if JSON.exists() else {}
    if run is not None:
        old = runs.get(run["torch"], {"libraries": {}})["libraries"]
        libraries = {**old}
        for lib, data in run["libraries"].items():
            kept = [r for r in old.get(lib, {}).get("cases", [])
                    if (r["mode"] not in run["modes"] or (run["only"] and run["only"] not in
                                                          r["case"]))
                    and old[lib].get("version") == data.get("version")]
            libraries[lib] = {**data, "cases": kept + data["cases"]}
        runs[run["torch"]] = {k: v for k, v in run.items() if k not in ("modes", "only")} | {
            "libraries": libraries}
        JSON.write_text(json.dumps({"runs": runs}, indent=1, sort_keys=True) + "\n")
    section = render(runs)
    text = MARKDOWN.read_text() if MARKDOWN.exists() else (
        "# The libraries around PyTorch on pjrt\n\n")
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    MARKDOWN.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", choices=[[]] + list(LIBRARIES),
                        help="which libraries (default: all)")
    parser.add_argument("--modes", nargs="+", default=list(MODE_ORDER), choices=MODE_ORDER)
    parser.add_argument("-k", dest="only", help="only the cases whose name holds this")
    parser.add_argument("--report", action="store_true",
                        help="write docs/ecosystem.json and docs/ecosystem.md")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cases docs/ecosystem.json has for this torch; run the rest")
    parser.add_argument("--render", action="store_true",
                        help="only redraw docs/ecosystem.md from docs/ecosystem.json")
    args = parser.parse_args(argv)
    if args.render:
        write_report(None)
        return 0
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(ROOT / "tests"))
    import jax
    import torch

    run = {"torch": torch.__version__.split("+")[0], "jax": jax.__version__,
           "python": platform.python_version(), "date": datetime.date.today().isoformat(),
           "libraries": {}, "modes": list(args.modes), "only": args.only}
    for name in args.libraries or list(LIBRARIES):
        def save(data, name=name):  # a long sweep stopped midway keeps what it found
            run["libraries"][name] = data
            if args.report:
                write_report(dict(run, libraries=dict(run["libraries"])))
        done = []
        if args.resume and JSON.exists():
            old = json.loads(JSON.read_text())["runs"].get(run["torch"], {"libraries": {}})
            done = [r for r in old["libraries"].get(name, {}).get("cases", [])
                    if r["mode"] in args.modes and (not args.only or args.only in r["case"])]
        run["libraries"][name] = run_library(name, tuple(args.modes), args.only, save, done)
        if run["libraries"][name].get("skipped"):
            print(f"{name:12s} skipped: {run['libraries'][name]['skipped']}", flush=True)
    if args.report:
        write_report(run)
    failed = sum(r["status"] not in ("pass", "rounding") for lib in run["libraries"].values()
                 for r in lib["cases"])
    print(f"{failed} case(s) not passing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
