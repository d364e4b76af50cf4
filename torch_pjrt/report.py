"""torch_pjrt.metrics.report(): what the backend did, and what to change, in plain text.

Built from the counters (torch_pjrt.metrics(), whose numbers it quotes) and the records
runtime/watch.py keeps: programs and their compiles, each recompile with its reason,
the lines of user code that made the host wait for the device, CPU fallbacks by op and
line, torch.compile graph breaks with Dynamo's reasons, transfers, memory peaks, and a
verdict on whether a training loop reached a steady state.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from . import counters

_SHOWN = 10  # rows per table


class Metrics:
    """`torch_pjrt.metrics()`: a snapshot of every counter (a dict);
    `torch_pjrt.metrics.report()`: the report, as text; `.reset()`: start counting again."""

    def __call__(self) -> dict[str, Any]:
        return counters.metrics()

    def report(self) -> str:
        return report()

    def reset(self) -> None:
        counters.reset()

    def __repr__(self) -> str:
        return "<torch_pjrt.metrics: call it for the counters, .report() for the report>"


metrics = Metrics()


def report() -> str:
    """The report of everything since the process started (or the last reset)."""
    from .runtime import watch

    m = counters.metrics()
    out = [_header(watch), "", "steady state: " + verdict(), ""]
    out += _programs(m, watch)
    out += _recompiles(watch)
    out += _syncs(m, watch)
    out += _fallbacks(m, watch)
    out += _graph_breaks()
    out += _transfers_and_memory(m)
    return "\n".join(out).rstrip() + "\n"


def _header(watch) -> str:
    import time

    from .eager import modes

    seconds = time.time() - watch.started()
    notes = "" if watch.notes else " (TORCH_PJRT_METRICS=0: no lines of user code noted)"
    return (f"torch-pjrt metrics report: {seconds:.1f} s, {watch.steps()} optimizer steps, "
            f"eager mode {modes.get()}{notes}")


# -------------------------------------------------------------------- verdict
def verdict() -> str:
    """One line: did the loop stop compiling (and does it wait for the device each step)?"""
    from .runtime import sites, watch

    steps = watch.steps()
    compile_steps = watch.compile_steps()
    recompiles, _ = watch.recompiles()
    waits = _per_step_syncs(watch)
    wait_text = ""
    if waits:
        (what, where), count = waits
        per_step = "once" if count == steps else f"{count / steps:.3g} times"
        wait_text = (f"; the host waits for the device {per_step} per step at "
                     f"{sites.text(where)} ({what})")
    if steps == 0:
        n = len(compile_steps)
        return (f"no optimizer steps seen; {n} program{'s' * (n != 1)} compiled or loaded"
                if n else "nothing compiled yet")
    last = max(compile_steps, default=None)
    if last is None:
        return f"no compiles in {steps} steps{wait_text}"
    recent = set(watch.recompile_steps()) & set(range(max(0, steps - 4), steps + 1))
    if len(recent) >= min(3, steps) and recompiles:
        r = recompiles[-1]
        changes = r.reason.split("; ")
        more = f" (and {len(changes) - 1} more changes)" if len(changes) > 1 else ""
        return (f"recompiling every step: {r.what}: {changes[0]}{more}, at "
                f"{sites.text(r.site)}{wait_text}")
    if last >= steps:
        return f"still compiling: programs compiled in the last step ({steps}){wait_text}"
    return f"no compiles after step {last + 1} (of {steps}){wait_text}"


def _per_step_syncs(watch):
    """The most frequent sync site, if it waits at least once per optimizer step."""
    steps = watch.steps()
    if steps < 2:
        return None
    by_site = watch.syncs()
    if not by_site:
        return None
    (key, count), = by_site.most_common(1)
    return (key, count) if count >= steps and key[1] is not None else None


# --------------------------------------------------------------------- tables
def _programs(m: dict, watch) -> list[str]:
    from .runtime import sites

    progs = watch.programs()
    compiled = sum(p.compiles for p in progs)
    loaded = sum(p.loads for p in progs)
    seconds = sum(p.seconds for p in progs)
    out = [f"programs: {m.get('compiles', 0)} compiles ({compiled} by XLA, {loaded} from the "
           f"disk cache, {seconds:.2f} s), {m.get('recompiles', 0)} recompiles"]
    out += compile_cost(m, watch)
    if progs:
        rows = sorted(progs, key=lambda p: -p.seconds)[:_SHOWN]
        out.append(_table(["program", "compiles", "disk", "seconds", "ops", "size", "step",
                           "at", "what"],
                          [[p.name, p.compiles, p.loads, f"{p.seconds:.2f}", len(p.ops) or "",
                            _bytes(p.nbytes) if p.nbytes is not None else "", _step(p.step),
                            sites.text(p.site), _clip(p.title, 50)] for p in rows]))
        if len(progs) > _SHOWN:
            out.append(f"  ... and {len(progs) - _SHOWN} more")
    return out + [""]


_BIG_GRAPH = 1000  # ops: a fused graph this long usually means no value was read for long


def compile_cost(m: dict, watch) -> list[str]:
    """Where the time went to making programs: XLA's compiles (and how much of that ran in
    the background while the program went on), loads from the disk cache, and the slowest
    program, with what made it slow."""
    from .runtime import sites

    xla, xla_s = m.get("xla_compiles", 0), m.get("xla_compile_seconds", 0.0)
    disk, disk_s = m.get("disk_loads", 0), m.get("disk_load_seconds", 0.0)
    if not xla and not disk:
        return []
    behind = m.get("background_compile_seconds", 0.0)
    waited = xla_s + disk_s - behind
    out = [f"compile time: {xla_s:.2f} s compiling {xla} program{'s' * (xla != 1)} with XLA, "
           f"{disk_s:.2f} s loading {disk} from the disk cache; {behind:.2f} s of it in the "
           f"background, {waited:.2f} s waited for"]
    progs = watch.programs()
    slowest = max(progs, key=lambda p: p.seconds, default=None)
    if slowest is None or not slowest.seconds:
        return out
    size = f", {_bytes(slowest.nbytes)} compiled" if slowest.nbytes is not None else ""
    how = "compiled" if slowest.compiles else "loaded from the disk cache"
    out.append(f"  slowest: {slowest.name}, {slowest.seconds:.2f} s: {slowest.title}{size}; "
               f"{how} at {sites.text(slowest.site)} (step {_step(slowest.step)})"
               + _why(slowest))
    return out


def _why(p) -> str:
    """What made a slow program big, where the report can tell."""
    n = len(p.ops)
    if p.kind == "graph" and n >= _BIG_GRAPH:
        return (f". Its {n} ops ran as one program because no value was read between "
                "them (a loop such as generate()'s records every step into one graph); "
                "XLA's compile time grows with a program's size: reading a value sooner, "
                "or TORCH_PJRT_FUSED_MAX_OPS, cuts it into programs that compile faster")
    return ""


def _recompiles(watch) -> list[str]:
    from .runtime import sites

    noted, dropped = watch.recompiles()
    if not noted:
        return []
    groups: dict[str, list] = {}
    for r in noted:
        groups.setdefault(r.what, []).append(r)
    ops = sum(r.kind == "op" for r in noted)
    out = [f"recompiles (the same code compiled for other inputs): "
           f"{len(noted) + dropped - ops} of graphs"
           + (f", {ops} of single ops (strict mode, or a graph of one op)" if ops else "")]
    rows = []
    for what, rs in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:_SHOWN]:
        last = rs[-1]
        rows.append([len(rs), _clip(what, 50), _clip(last.reason, 70), sites.text(last.site),
                     _step(last.step)])
    out.append(_table(["count", "code", "last change", "at", "step"], rows))
    return out + [""]


def _syncs(m: dict, watch) -> list[str]:
    from .runtime import sites

    by_site = watch.syncs()
    total = sum(by_site.values())
    flushes = {k.split(".", 1)[1]: v for k, v in m.items()
               if k.startswith("flushes.") and isinstance(v, int)}
    out = [f"synchronizations (the host waited for the device): {total}"]
    if by_site:
        out.append(_table(["count", "at", "what"],
                          [[n, sites.text(where), what]
                           for (what, where), n in by_site.most_common(_SHOWN)]))
    if flushes:
        parts = ", ".join(f"{reason} {n}" for reason, n in
                          sorted(flushes.items(), key=lambda kv: -kv[1]))
        out.append(f"fused graphs run: {m.get('flushes', 0)} ({parts})")
    return out + [""]


def _fallbacks(m: dict, watch) -> list[str]:
    from .runtime import sites

    by_op = m.get("cpu_fallbacks") or {}
    if not by_op:
        return []
    where: dict[str, Counter] = {}
    for (op, site), n in watch.fallbacks().items():
        where.setdefault(op, Counter())[site] += n
    rows = []
    for op, n in sorted(by_op.items(), key=lambda kv: -kv[1])[:_SHOWN]:
        top = where.get(op, Counter()).most_common(1)
        rows.append([n, op, sites.text(top[0][0]) if top else ""])
    return [f"CPU fallbacks (ops without a lowering): {sum(by_op.values())} calls of "
            f"{len(by_op)} ops", _table(["calls", "op", "mostly at"], rows), ""]


def _graph_breaks() -> list[str]:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return []
    breaks = _since_reset(dynamo, "graph_break")
    if not breaks:
        return []
    rows = [[n, _clip(_break_reason(str(reason)), 120)]
            for reason, n in breaks.most_common(_SHOWN)]
    out = [f"torch.compile graph breaks: {sum(breaks.values())}",
           _table(["count", "reason (Dynamo's)"], rows)]
    # Dynamo resumes after each break in a function it names with the code's place
    resumes = _since_reset(dynamo, "resumes")
    if resumes:
        places = [name.removeprefix("torch_dynamo_resume_in_").replace("_at_", " at line ")
                  + (f" (x{n})" if n > 1 else "") for name, n in resumes.most_common(_SHOWN)]
        out.append(f"  resumed after breaks in: {', '.join(places)}")
    return out + [""]


_dynamo_at_reset: dict[str, Counter] = {}  # Dynamo's counters when ours were reset


def _since_reset(dynamo, name: str) -> Counter:
    return Counter(dynamo.counters.get(name, {})) - _dynamo_at_reset.get(name, Counter())


def _note_dynamo_counters() -> None:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        for name in ("graph_break", "resumes"):
            _dynamo_at_reset[name] = Counter(dynamo.counters.get(name, {}))


counters.on_reset(_note_dynamo_counters)


def _break_reason(reason: str) -> str:
    """Dynamo's reason in one line: its title and its explanation."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    title = lines[0] if lines else reason
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines
                        if line.startswith("Explanation:")), "")
    return f"{title}: {explanation}" if explanation else title


def _transfers_and_memory(m: dict) -> list[str]:
    from .runtime import memory

    out = [f"transfers: host to device {_bytes(m.get('host_to_device_bytes', 0))}, "
           f"device to host {_bytes(m.get('device_to_host_bytes', 0))}"]
    for index, d in sorted(memory._devices.items()):
        out.append(f"memory pjrt:{index}: peak {_bytes(d.peak)}, now {_bytes(d.allocated)} "
                   f"(limit {_bytes(d.limit)})")
    return out


# -------------------------------------------------------------------- format
def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in cells)


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _step(step: int | None) -> str:
    return "-" if step is None else str(step + 1)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def print_at_exit() -> None:
    """TORCH_PJRT_METRICS=1: the report on stderr when the process ends."""
    from . import runtime

    if runtime._initialized:
        print(report(), file=sys.stderr, end="", flush=True)


def _at_exit() -> None:
    import atexit

    from .runtime import watch

    if watch.loud:
        atexit.register(print_at_exit)


_at_exit()
