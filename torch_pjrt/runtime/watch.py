"""What the backend did, for those who watch it: the records behind the metrics report,
profiles and program dumps, and the switches the hot paths test before noting anything.

Cheap notes are always taken where something rare happens (a compile, a recompile, a
synchronization, a CPU fallback, an optimizer step), with the user's line of code
(sites.py) unless TORCH_PJRT_METRICS=0. Per-op notes (each recorded op's line) are taken
only while a profile or a dump asks for them (`op_sites`). torch_pjrt.metrics.report()
reads these records; torch_pjrt.counters holds the counts they agree with.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

from .. import _env, counters, logs
from . import sites as _sites

# ---------------------------------------------------------------- the switches
notes = True  # note the user's line at syncs, compiles and fallbacks (TORCH_PJRT_METRICS!=0)
loud = False  # TORCH_PJRT_METRICS=1: the report at exit, warnings for per-step syncs
profiling = False  # a torch.profiler session with the pjrt activity is recording
dumping = False  # TORCH_PJRT_DUMP_DIR is set
op_sites = False  # note each recorded op's line (profiling or dumping)
_op_sites_hook = None  # tells the native kernel of lowered ops to leave records to Python


def set_profiling(on: bool) -> None:
    global profiling
    profiling = on
    _update_op_sites()


def set_dumping(on: bool) -> None:
    global dumping
    dumping = on
    _update_op_sites()


def set_op_sites_hook(fn) -> None:
    """`fn(on)`: while on, every recorded op goes through Python (which notes its line)."""
    global _op_sites_hook
    _op_sites_hook = fn
    _update_op_sites()


def _update_op_sites() -> None:
    global op_sites
    op_sites = profiling or dumping
    if _op_sites_hook is not None:
        _op_sites_hook(op_sites)


def configure() -> None:
    """Read TORCH_PJRT_METRICS (at import). Compiles, recompiles and CPU fallbacks are
    logged at INFO under the torch_pjrt logger (logs.py; TORCH_PJRT_VERBOSE=1 shows them)."""
    global notes, loud
    value = _env.get("TORCH_PJRT_METRICS").strip().lower()
    notes = value not in ("0", "off", "false", "no")
    loud = value in ("1", "on", "true", "yes", "exit")


def site():
    """The user's line, where notes are taken (else None)."""
    return _sites.user_site() if notes else None


node_sites: dict[int, tuple | None] = {}  # id of a pending fused-graph node -> its op's line


def noted_op(node) -> None:
    """A recorded op's line of user code (while op_sites), until its graph runs."""
    node_sites[id(node)] = _sites.user_site()


# -------------------------------------------------------------------- programs
@dataclass
class Program:
    """One compiled XLA program: a strict op, a fused graph or a torch.compile graph.

    `name` is how profiles and dump files call it: its kind and the first 12 hex digits of
    its digest (the key of the persistent compile cache)."""

    digest: str
    kind: str  # "op", "graph" (fused eager) or "compiled" (torch.compile)
    title: str  # 'aten.add.Tensor(float32[8])', 'fused graph of 57 ops', ...
    ops: list = field(default_factory=list)  # (op or FX node, signature or target, site)
    compiles: int = 0  # compiled by XLA in this process
    loads: int = 0  # taken from the disk cache
    seconds: float = 0.0  # compiling or loading
    background: float = 0.0  # of those seconds, spent while the user's program went on
    nbytes: int | None = None  # its size, serialized (as the disk cache holds it)
    step: int | None = None  # the optimizer step in which it first compiled or loaded
    site: tuple | None = None  # the user's line at that moment

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.digest[:12]}"

    @property
    def label(self) -> str:
        """The name with what it computes, briefly: what a profile's table shows."""
        if self.kind == "op" and self.ops:
            return f"{self.name} {self.ops[0][0]}"
        return f"{self.name} ({len(self.ops)} ops)" if self.ops else self.name


_programs: dict[str, Program] = {}  # digest -> its record (described or compiled)


def describe(digest: str, kind: str, title: str, ops: list) -> Program:
    """What a program holds, from the code that builds it (before it compiles)."""
    p = _programs.get(digest)
    if p is None:
        p = _programs[digest] = Program(digest, kind, title, list(ops))
    elif ops and not p.ops:
        p.ops = list(ops)
    return p


_op_descriptions: dict[str, tuple[str, str, list]] = {}  # op name -> (kind, title, ops)


def describe_op(op: str, kind: str, title: str, ops: list) -> None:
    """What the programs of an op hold, for an op that is a whole graph (torch.compile's
    graphs are ops): its entries' programs are described with this."""
    _op_descriptions[op] = (kind, title, list(ops))


def describe_entry(digest: str, op: str, signature: str) -> Program:
    """The program of one signature of an op (strict mode, or a torch.compile graph)."""
    found = _op_descriptions.get(op)
    if found is not None:
        return describe(digest, *found)
    return describe(digest, "op", signature, [(op, signature, None)])


def program(digest: str) -> Program:
    """The record of a program (one that nobody described is an op of unknown kind)."""
    p = _programs.get(digest)
    if p is None:
        p = _programs[digest] = Program(digest, "op", "a program")
    return p


def programs() -> list[Program]:
    """Programs that compiled or loaded in this process, in that order."""
    return [p for p in _programs.values() if p.compiles or p.loads]


last_compile: tuple[str, str] | None = None  # (digest, "compiled" or "disk") of the last
_local = threading.local()  # .site: set while this thread compiles in the background


@contextlib.contextmanager
def background(where: tuple | None = None):
    """Around compiles that run while the user's program goes on (on a thread of the
    engine's): their seconds count as background ones (metrics()'s
    `background_compile_seconds`), and `where` (the user's line when the compile was
    asked for: site() on the user's thread) is the line their records show."""
    before = getattr(_local, "site", None)
    _local.site = where if where is not None else ("<background>", 0, "")
    try:
        yield
    finally:
        _local.site = before


def in_background() -> bool:
    return getattr(_local, "site", None) is not None


def compiled(digest: str, source: str, seconds: float, nbytes: int | None = None) -> Program:
    """A program was compiled by XLA (`source` "compiled") or loaded from the disk cache
    ("disk"), taking `seconds` (in the background, inside background()); `nbytes`: its
    size serialized, where known."""
    global last_compile
    p = program(digest)
    behind = getattr(_local, "site", None)
    where = behind if behind is not None else site()
    if source == "disk":
        p.loads += 1
        counters.count("disk_loads")
        counters.add_seconds("disk_load_seconds", seconds)
    else:
        p.compiles += 1
        counters.count("xla_compiles")
        counters.add_seconds("xla_compile_seconds", seconds)
    if behind is not None:
        p.background += seconds
        counters.count("background_compiles")
        counters.add_seconds("background_compile_seconds", seconds)
    p.seconds += seconds
    if nbytes is not None:
        p.nbytes = nbytes
    if p.step is None:
        p.step = _steps
        p.site = where
    _compile_steps.append(_steps)
    last_compile = (digest, source)
    if logs.compiles.isEnabledFor(logs.INFO):
        how = "loaded from the disk cache" if source == "disk" else "compiled"
        size = f", {_size(nbytes)}" if nbytes is not None else ""
        m = counters.metrics()
        logs.compiles.info(
            "%s %s (%s%s) in %.2f s%s, at %s; so far %.1f s compiling %d programs "
            "(%.1f s of it in the background), %.1f s loading %d", how, p.name, p.title,
            size, seconds, " in the background" if behind is not None else "",
            _sites.text(where), m.get("xla_compile_seconds", 0.0),
            m.get("xla_compiles", 0), m.get("background_compile_seconds", 0.0),
            m.get("disk_load_seconds", 0.0), m.get("disk_loads", 0))
    return p


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.0f} KB"


# ------------------------------------------------------------------ recompiles
@dataclass
class Recompile:
    what: str  # the program's code: 'a fused graph of 57 ops (aten.mm, ...)'
    reason: str  # which input of which op or graph changed, and how
    step: int
    site: tuple | None
    kind: str  # "fused" or "compiled" graph (counted in metrics()), or "op" (strict mode)


_recompiles: list[Recompile] = []
_RECOMPILES_KEPT = 1000  # the first ones are kept, and the count of the rest


def recompiled(what: str, reason: str, kind: str) -> None:
    """The same code compiled again for other inputs (eager.recompiles tells why)."""
    global _recompiles_dropped
    where = site()
    if len(_recompiles) < _RECOMPILES_KEPT:
        _recompiles.append(Recompile(what, reason, _steps, where, kind))
    else:
        _recompiles_dropped += 1
    _recompile_steps.append(_steps)
    if logs.recompiles.isEnabledFor(logs.INFO):
        logs.recompiles.info("recompiling %s: %s, at %s", what, reason, _sites.text(where))


_recompiles_dropped = 0


def recompiles() -> tuple[list[Recompile], int]:
    """(the recompiles noted, how many more happened)."""
    return list(_recompiles), _recompiles_dropped


# ---------------------------------------------------------- syncs and fallbacks
_syncs: Counter = Counter()  # (what, site) -> times the host waited for the device there
_fallbacks: Counter = Counter()  # (op, site) -> calls run on the CPU from there
_sync_steps: dict = {}  # site -> [first step of the current run of steps, last step]
_warned_sites: set = set()
_STEPS_TO_WARN = 5  # a site syncing in this many consecutive steps is warned about


def synced(what: str) -> None:
    """The host waited for the device (`what`: 'copy to host', 'synchronize', ...)."""
    where = site()
    _syncs[(what, where)] += 1
    if loud and where is not None:
        _note_step_site(where, what)


def fell_back(op: str) -> None:
    where = site()
    _fallbacks[(op, where)] += 1
    if logs.fallbacks.isEnabledFor(logs.INFO):
        logs.fallbacks.info("%s ran on the CPU (no lowering), at %s", op, _sites.text(where))


def syncs() -> Counter:
    return Counter(_syncs)


def fallbacks() -> Counter:
    return Counter(_fallbacks)


def _note_step_site(where: tuple, what: str) -> None:
    run = _sync_steps.get(where)
    if run is None or _steps > run[1] + 1:
        _sync_steps[where] = [_steps, _steps]
        return
    run[1] = _steps
    if run[1] - run[0] + 1 >= _STEPS_TO_WARN and where not in _warned_sites:
        _warned_sites.add(where)
        path, line, _ = where
        warnings.warn_explicit(
            f"pjrt: this line makes the host wait for the device ({what}) in every training "
            f"step ({run[1] - run[0] + 1} steps so far): the host cannot record the next "
            "step while the device runs this one. Read values every few steps instead "
            "(see torch_pjrt.metrics.report()).", UserWarning, path, line)


# ------------------------------------------------------------------------ steps
_steps = 0  # optimizer steps taken
_compile_steps: list[int] = []  # the step of each compile or load
_recompile_steps: list[int] = []
_started = time.time()


_step_hooks: list = []  # called after each optimizer step (precompile's stop)


def on_step(fn) -> None:
    """`fn()` is called at the end of every optimizer step, once it is counted."""
    _step_hooks.append(fn)


def stepped() -> None:
    """An optimizer step ended (what the report's steady-state verdict counts in)."""
    global _steps
    _steps += 1
    if loud and _recompile_steps and _recompile_steps[-1] == _steps - 1:
        _warn_recompiling()
    for fn in _step_hooks:
        fn()


def steps() -> int:
    return _steps


def compile_steps() -> list[int]:
    return list(_compile_steps)


def recompile_steps() -> list[int]:
    return list(_recompile_steps)


_warned_recompiling = False


def _warn_recompiling() -> None:
    """Once: recompiles in each of the last few steps."""
    global _warned_recompiling
    window = range(_steps - _STEPS_TO_WARN, _steps)
    recent = {s for s in reversed(_recompile_steps[-1000:]) if s in window}
    if _warned_recompiling or len(recent) < _STEPS_TO_WARN:
        return
    _warned_recompiling = True
    last = _recompiles[-1] if _recompiles else None
    text = f" ({last.what}: {last.reason})" if last else ""
    warnings.warn(f"pjrt: the training loop recompiles in every step{text}; see "
                  "torch_pjrt.metrics.report()", UserWarning, stacklevel=3)


def reset() -> None:
    """Forget everything noted (with torch_pjrt.counters.reset())."""
    global _recompiles_dropped, _steps, last_compile, _warned_recompiling, _started
    for p in _programs.values():
        p.compiles = p.loads = 0
        p.seconds = p.background = 0.0
        p.step = p.site = None
    _recompiles.clear()
    _recompiles_dropped = 0
    _syncs.clear()
    _fallbacks.clear()
    _sync_steps.clear()
    _compile_steps.clear()
    _recompile_steps.clear()
    _steps = 0
    last_compile = None
    _warned_recompiling = False
    _started = time.time()


def started() -> float:
    return _started


counters.on_reset(reset)
configure()
