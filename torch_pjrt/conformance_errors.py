"""OpInfo error inputs on pjrt: what the CPU rejects, pjrt must reject with the same error.

Each OpInfo of op_db may list error inputs (`OpInfo.error_inputs`): arguments
the op must reject, with the exception type and a regex of the message. Each is
run on the CPU (the reference) and on pjrt in each mode: strict, fused and debug
eager against the CPU in eager, and torch.compile(backend="pjrt") against the
CPU under torch.compile(backend="aot_eager") (Dynamo wraps errors it meets while
tracing, on every backend). After the call the sweep synchronizes, so an error
checked on the device, which surfaces at the next synchronization, counts. Each
input gets one outcome per mode:

- `match`: the CPU's exception type, and a message the ErrorInput's regex finds
  (where it finds the CPU's);
- `type`: the CPU's exception type, another message;
- `other`: another exception type;
- `silent`: no error at all: a result where the CPU refuses one, the outcome
  that must never happen.

Inputs the CPU accepts (op_db lists a few for other devices) are counted apart.
`python -m torch_pjrt ops --errors --report` writes docs/error-inputs.md;
tests/lowering/test_error_inputs.py runs the sweep in CI.
(`error_inputs_sparse` lists inputs of sparse layouts only, which pjrt does not
support: not run.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .conformance import (
    DEVICE,
    OpTimeout,
    first_line,
    op_name,
    quiet,
    select_ops,
    sync_result,
    time_limit_of,
    to_pjrt,
)

MODES = ("strict", "fused", "debug", "compile")
OUTCOMES = ("match", "type", "other", "silent")
FAILING = ("other", "silent")  # outcomes that break "rejected as on the CPU"


@dataclass
class ErrorResult:
    """How one op's error inputs did."""

    name: str
    inputs: int = 0  # error inputs op_db lists for the op
    cpu_accepts: int = 0  # of them, inputs the CPU runs without an error (eager)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # mode -> outcome -> n
    failures: dict[str, list[str]] = field(default_factory=dict)  # mode -> other/silent, why
    error: str = ""  # the sweep itself failed on the op (time limit, generator raised)
    seconds: float = 0.0

    def failed(self, mode: str) -> int:
        c = self.counts.get(mode, {})
        return sum(c.get(o, 0) for o in FAILING)

    def rejected(self, mode: str) -> int:
        """Inputs the CPU rejects in that mode (the ones compared)."""
        return sum(self.counts.get(mode, {}).values())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ErrorResult:
        return ErrorResult(**d)


# ------------------------------------------------------------------ running
def _error_inputs(opinfo) -> list:
    """The op's error inputs, generated afresh with a fixed seed (each run gets its own
    tensors: an op may write into its inputs before it raises)."""
    torch.manual_seed(0)
    return list(opinfo.error_inputs("cpu"))


def _call(fn: Callable, sample, on_pjrt: bool = False) -> BaseException | None:
    """The exception fn raises on the sample (`on_pjrt`: copied to pjrt first, aliased as on
    the CPU), by the next synchronization; None if none."""
    try:
        if on_pjrt:
            sample = to_pjrt(sample, aliasing=True)
        out = fn(sample.input, *sample.args, **sample.kwargs)
        sync_result(out)
        if any(isinstance(t, torch.Tensor) and t.device.type == DEVICE
               for t in (sample.input, *sample.args)):
            torch.pjrt.synchronize()  # an op that writes an input, or returns nothing
        return None
    except OpTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return e
    finally:
        _drain()


def _drain() -> None:
    """Report nothing left from this input to the next one: a device-side check queued
    by an op that then raised on the host, a graph pending in fused mode."""
    from .lowering import checks

    with contextlib.suppress(Exception):
        torch.pjrt.synchronize()
    with contextlib.suppress(Exception):
        checks.raise_pending()


def _compiled(opinfo, backend: str) -> Callable:
    torch._dynamo.reset()  # a fresh compile per input: never the recompile limit's eager run

    def run(*args, **kwargs):
        return opinfo(*args, **kwargs)

    return torch.compile(run, backend=backend, dynamic=False)


def _outcome(expected: BaseException, got: BaseException | None, regex: str | None) -> str:
    if got is None:
        return "silent"
    if not isinstance(got, type(expected)):
        return "other"
    if regex and re.search(regex, str(expected)) and not re.search(regex, str(got)):
        return "type"
    return "match"


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    from .eager import modes

    with modes.set_eager_mode("fused" if mode == "compile" else mode):
        yield


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    """Dynamo and fake tensors log every error they meet while tracing: expected here."""
    names = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch._functorch")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_op_errors(opinfo, modes: Iterable[str] = MODES, *,
                  time_limit: float | None = 120.0) -> ErrorResult:
    """Every error input of one op, on the CPU and on pjrt in each mode."""
    modes = tuple(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"modes {unknown}; accepted: {MODES}")
    result = ErrorResult(op_name(opinfo))
    start = time.perf_counter()
    try:
        with quiet(), _quiet_tracing(), time_limit_of(time_limit):
            _run_modes(opinfo, modes, result)
    except OpTimeout as e:
        result.error = f"timeout: {e}"
    except Exception as e:  # noqa: BLE001 - one bad op must not stop the sweep
        result.error = first_line(e)
    finally:
        _drain()
        result.seconds = round(time.perf_counter() - start, 3)
    return result


def _run_modes(opinfo, modes: tuple[str, ...], result: ErrorResult) -> None:
    inputs = _error_inputs(opinfo)
    result.inputs = len(inputs)
    if not inputs:
        return
    cpu = [_call(opinfo, ei.sample_input) for ei in inputs]
    result.cpu_accepts = sum(e is None for e in cpu)
    compiled_cpu = None
    for mode in modes:
        counts = dict.fromkeys(OUTCOMES, 0)
        failures = []
        if mode == "compile" and compiled_cpu is None:
            compiled_cpu = [_call(_compiled(opinfo, "aot_eager"), ei.sample_input)
                            for ei in _error_inputs(opinfo)]
        reference = compiled_cpu if mode == "compile" else cpu
        for i, ei in enumerate(_error_inputs(opinfo)):
            expected = reference[i]
            if expected is None:
                continue
            fn = _compiled(opinfo, "pjrt") if mode == "compile" else opinfo
            with _mode(mode):
                got = _call(fn, ei.sample_input, on_pjrt=True)
            outcome = _outcome(expected, got, ei.error_regex)
            counts[outcome] += 1
            if outcome in FAILING:
                failures.append(f"input {i}: CPU raised {first_line(expected)}; pjrt "
                                + ("raised nothing" if got is None else
                                   f"raised {first_line(got)}"))
        result.counts[mode] = counts
        if failures:
            result.failures[mode] = failures


def ops_with_error_inputs(names: Iterable[str] | None = None) -> list:
    """The OpInfos (of those named, or all of op_db) that list error inputs."""
    return [o for o in select_ops(names) if o.error_inputs_func is not None]


def sweep(opinfos: Iterable, modes: Iterable[str] = MODES, *, time_limit: float | None = 120.0,
          on_result: Callable[[ErrorResult], None] | None = None) -> list[ErrorResult]:
    from .conformance import release_compiled

    results = []
    for opinfo in opinfos:
        r = run_op_errors(opinfo, modes, time_limit=time_limit)
        release_compiled()
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results


# ------------------------------------------------------------ known failures
def verdict(r: ErrorResult, mode: str, known: dict[str, str] | None = None) -> str:
    """"ok", "expected" (failing, listed), "unexpected" (failing, not listed) or "fixed"
    (listed, every input rejected as on the CPU now: shrink the list). A listed name is
    `op` (every mode) or `op@mode`."""
    if known is None:
        from .conformance_known_failures import ERROR_INPUTS as known
    listed = f"{r.name}@{mode}" in known or r.name in known
    if r.failed(mode) or r.error:
        return "expected" if listed else "unexpected"
    if f"{r.name}@{mode}" in known or (r.name in known and not any(
            r.failed(m) for m in r.counts)):
        return "fixed"
    return "ok"


# ----------------------------------------------------------------- reports
def totals(results: list[ErrorResult], modes: Iterable[str] = MODES) -> dict[str, dict]:
    """Per mode: ops and inputs compared, and the count of each outcome."""
    out = {}
    for mode in modes:
        ran = [r for r in results if mode in r.counts]
        counts = dict.fromkeys(OUTCOMES, 0)
        for r in ran:
            for o, n in r.counts[mode].items():
                counts[o] += n
        rejected = sum(counts.values())
        out[mode] = {"ops": sum(r.rejected(mode) > 0 for r in ran), "rejected": rejected,
                     **counts, "same_type": counts["match"] + counts["type"],
                     "ops_failing": sum(r.failed(mode) > 0 for r in ran)}
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[ErrorResult], modes: Iterable[str] = MODES, *, header: str = "",
             known: dict[str, str] | None = None) -> str:
    if known is None:
        from .conformance_known_failures import ERROR_INPUTS as known
    modes = tuple(modes)
    t = totals(results, modes)
    inputs = sum(r.inputs for r in results)
    accepts = sum(r.cpu_accepts for r in results)
    with_inputs = sum(r.inputs > 0 for r in results)
    lines = [
        "# Error inputs: what the CPU rejects, pjrt rejects",
        "",
        "Generated by `python -m torch_pjrt ops --errors --report` "
        "(torch_pjrt/conformance_errors.py): every error input of PyTorch's `op_db` "
        "(`OpInfo.error_inputs`) run on the CPU and on `pjrt`, in strict, fused and debug "
        "eager (against the CPU in eager) and under `torch.compile(backend=\"pjrt\")` "
        "(against the CPU under `torch.compile(backend=\"aot_eager\")`: Dynamo wraps the "
        "errors it meets while tracing). Each call is followed by a synchronization, so "
        "errors checked on the device count. `match`: the CPU's exception type and a "
        "message the input's regex finds; `type`: the same type, another message; "
        "`other`: another exception type; `silent`: no error, where the CPU raises.",
        "",
    ]
    if header:
        lines += [header, ""]
    lines += [
        f"{with_inputs} ops list {inputs} error inputs; the CPU accepts {accepts} of them in "
        "eager (inputs op_db lists for other devices), which are not compared.",
        "",
        "| mode | ops | inputs the CPU rejects | same type | match | type only | other type "
        "| silent | same type % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in modes:
        m = t[mode]
        pct = 100.0 * m["same_type"] / m["rejected"] if m["rejected"] else 0.0
        lines.append(f"| {mode} | {m['ops']} | {m['rejected']} | {m['same_type']} | "
                     f"{m['match']} | {m['type']} | {m['other']} | {m['silent']} | "
                     f"{pct:.1f} |")
    lines += [
        "",
        "Known exceptions (`ERROR_INPUTS` in torch_pjrt/conformance_known_failures.py), one "
        "reason each:",
        "",
    ]
    lines += [f"- `{name}`: {reason}" for name, reason in sorted(known.items())] or ["- none"]
    lines += [
        "",
        "Per op: inputs listed, inputs the CPU rejects (eager / compiled), and per mode "
        "the inputs rejected with the CPU's type. *known*: listed above; **new**: an "
        "unlisted failure; **fixed**: listed, passing now.",
        "",
        "| op | inputs | CPU rejects | " + " | ".join(modes) + " | notes |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in modes) + " | --- |",
    ]
    marks = {"expected": " *known*", "unexpected": " **new**", "fixed": " **fixed**", "ok": ""}
    for r in sorted(results, key=lambda r: r.name):
        if not r.inputs and not r.error:
            continue
        rejects = "/".join(str(r.rejected(m)) for m in ("strict", "compile") if m in r.counts)
        cells = []
        for mode in modes:
            if mode not in r.counts:
                cells.append("-")
                continue
            same = r.counts[mode]["match"] + r.counts[mode]["type"]
            cells.append(f"{same}/{r.rejected(mode)}{marks[verdict(r, mode, known)]}")
        notes = [f"{r.error}"] if r.error else []
        for mode, fails in r.failures.items():
            notes.append(f"{mode}: {fails[0]}" + (f" (+{len(fails) - 1} more)"
                                                  if len(fails) > 1 else ""))
        lines.append(f"| `{r.name}` | {r.inputs} | {rejects} | " + " | ".join(cells)
                     + f" | {_cell('; '.join(notes))} |")
    return "\n".join(lines) + "\n"
