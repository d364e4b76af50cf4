"""torch.profiler's pjrt activities: the Python side of runtime/native/profiler.cpp.

While a profile with the pjrt (PrivateUse1) activity records, `active` is true and the
launch paths hand each program run, transfer, compile, flush and synchronization to
this module; when the profile stops they go to the native session, which gives them to
Kineto linked to the op that launched them.

A program's device time is measured from the host. It ends when its outputs are ready:
a thread waits for each program in turn (a program whose outputs are about to be donated
to the next one is waited for by the launching thread first, as a donated array can no
longer be waited for). It starts when it was launched or when the previous program of its
device ended, whichever is later: a device runs its programs in order. Collectives have
their own track, as NCCL's stream has on a GPU: they run next to compute programs, in
order among themselves.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

from . import sites, watch

PROGRAM, TRANSFER, HOST, COLLECTIVE = 0, 1, 2, 3  # activity kinds, as profiler.cpp maps them
_STREAMS = {PROGRAM: 0, TRANSFER: 1, COLLECTIVE: 2}  # a device's tracks in the trace

active = False
_native = None
_events: list[tuple] = []  # (kind, name, start, end, device or 0, stream or thread, link, meta)
_runs: list[_Run] = []  # device activities of this profile, in launch order
_outputs: dict[int, _Run] = {}  # id of an array a run produces -> that run, until it ends
# The waiters, one per kind of track: each takes the ends of its runs in launch order, so
# a collective still running never delays the end seen of a compute program after it.
_queues: dict[int, queue.SimpleQueue] = {}  # by kind: PROGRAM (and TRANSFER), COLLECTIVE
_waiters: list[threading.Thread] = []
_lock = threading.Lock()
_switch_interval: float | None = None
_STOP_TIMEOUT = 120.0  # seconds to wait at the end of a profile for programs still running


class _Run:
    """A program run or a transfer on a device, until its end is seen."""

    __slots__ = ("kind", "name", "device", "launched", "end", "arrays", "link", "meta",
                 "after")

    def __init__(self, kind: int, name: str, device: int, launched: int, arrays: list,
                 link: int, meta: dict):
        self.kind = kind
        self.name = name
        self.device = device
        self.launched = launched
        self.end = 0
        self.arrays = arrays
        self.link = link
        self.meta = meta
        self.after: list[_Run] = []  # runs still going at its launch that it waits for


def install(native) -> bool:
    """Register the profiler with PyTorch; False where this build of torch has no Kineto."""
    global _native
    _native = native
    watch.set_op_sites_hook(native.set_python_records)
    return bool(native.profiler_install(_start, _stop))


def now() -> int:
    """The profile's clock: nanoseconds since the epoch, as PyTorch's own events."""
    return time.time_ns()


def _link() -> int:
    return _native.profiler_correlation() if _native is not None else 0


def host(name: str, start: int, meta: dict | None = None) -> None:
    """Something the host did from `start` until now (a compile, a flush, a wait)."""
    if active:
        _events.append((HOST, name, start, now(), 0, threading.get_native_id(), _link(),
                        meta or {}))


_compiles = 0  # compiles seen in this profile
_compiled_end = 0  # when the last of them ended
# programs compiled or loaded ahead of their first launch (a schedule's pieces, a background
# compile): digest -> "compiled" or "disk", what that launch reports instead of "memory"
_ahead: dict[str, str] = {}


def compiled(program: watch.Program, start: int, source: str) -> None:
    """A program was compiled (`source` "compiled") or loaded from disk ("disk")."""
    global _compiles, _compiled_end
    host(f"pjrt compile {program.name}", start, {"cache": source, "program": program.title})
    _compiles += 1
    _compiled_end = now()
    if active:
        _ahead[program.digest] = source


def launch(fn, digest: str, device: int, args: list, donated: list, ops: list | None):
    """fn(*args), the launch of program `digest` (which may compile it first), as a device
    activity; `ops`: (op, its line of user code) of each op it computes, in this run (None:
    as the program's description says)."""
    before_donation(donated)
    compiles = _compiles
    launched = now()
    results = fn(*args)
    program = watch.program(digest)
    if ops is None:
        ops = [(op, site) for op, _, site in program.ops]
    cache = _ahead.pop(digest, "memory")
    if _compiles != compiles:  # compiled first: the program ran after that
        launched = _compiled_end
        cache = watch.last_compile[1] if watch.last_compile else "compiled"
    run(program.label, device, launched, _leaves(results),
        {"program": program.title, "ops": _ops_text(ops), "sites": _sites_text(ops),
         "cache": cache})
    return results


def _leaves(results) -> list:
    if isinstance(results, (list, tuple)):
        return [x for r in results for x in _leaves(r)]
    return [results]


_OPS_SHOWN = 64


def _ops_text(ops: list) -> str:
    names = [op for op, _ in ops[:_OPS_SHOWN]]
    more = f", ... ({len(ops)} ops)" if len(ops) > _OPS_SHOWN else ""
    return ", ".join(names) + more


def _sites_text(ops: list) -> str:
    """The distinct lines of user code the ops came from, with how many came from each."""
    counts: dict = {}
    for _, site in ops:
        if site is not None:
            counts[site] = counts.get(site, 0) + 1
    shown = [sites.text(s) + (f" x{n}" if n > 1 else "") for s, n in
             list(counts.items())[:_OPS_SHOWN // 4]]
    return ", ".join(shown)


def producers(inputs, device: int) -> list[_Run]:
    """The runs still computing `inputs`, asked as a program that reads them launches
    (collectives, which run next to the programs, start once these end). Asked later, a
    waiter may have taken a producer's end meanwhile, late, after the launch."""
    if not active:
        return []
    with _lock:
        after = [_outputs[id(a)] for a in inputs if id(a) in _outputs]
        if any(id(a) not in _outputs and not _ready(a) for a in inputs):
            # an input still being computed by a run known by another array (a reshape
            # of its output, ...): the device runs its programs in launch order, so the
            # last one launched and still running ends no earlier than that producer
            last = next((p for p in reversed(_runs) if p.kind == PROGRAM
                         and p.device == device and not p.end), None)
            if last is not None:
                after.append(last)
    return after


def run(name: str, device: int, launched: int, arrays, meta: dict,
        kind: int = PROGRAM, after: list[_Run] | None = None) -> None:
    """A program (or a transfer) launched at `launched` on `device`, producing `arrays`:
    it ends when they are ready. It starts no earlier than the runs `after` end (the
    producers() of a collective's inputs)."""
    if not active:
        return
    arrays = [a for a in arrays if hasattr(a, "block_until_ready")]
    r = _Run(kind, name, device, launched, arrays, _link(), meta)
    with _lock:
        r.after = list(after or ())
        _runs.append(r)
        for a in r.arrays:
            _outputs[id(a)] = r
    _queues[COLLECTIVE if kind == COLLECTIVE else PROGRAM].put(r)


def _ready(a) -> bool:
    try:
        return a.is_ready()
    except Exception:  # noqa: BLE001 - deleted (donated) or failed: nothing to wait for
        return True


def done(name: str, device: int, start: int, meta: dict, kind: int = TRANSFER) -> None:
    """A device activity that ended now, timed by its caller (a copy to the host)."""
    if active:
        r = _Run(kind, name, device, start, [], _link(), meta)
        r.end = now()
        with _lock:
            _runs.append(r)


def before_donation(arrays) -> None:
    """Wait for the runs that produced arrays about to be donated (then deleted)."""
    if not _outputs:
        return
    for a in arrays:
        r = _outputs.get(id(a))
        if r is not None and not r.end:
            try:
                a.block_until_ready()
            except Exception:  # noqa: BLE001 - its failure is reported where it is read
                pass
            _ended(r, now())


def _ended(r: _Run, end: int) -> None:
    with _lock:
        if not r.end:
            r.end = end
        for a in r.arrays:
            _outputs.pop(id(a), None)
        r.arrays = []


def _wait_loop(q: queue.SimpleQueue) -> None:
    """The waiter: each run's end, in launch order."""
    while True:
        r = q.get()
        if r is None:
            return
        for a in list(r.arrays):
            if r.end:
                break
            try:
                a.block_until_ready()
                break
            except Exception:  # noqa: BLE001 - donated (its end is set) or failed
                continue
        _ended(r, now())


def _start() -> None:
    """The profile starts recording (profiler.cpp's Session::start)."""
    global active, _switch_interval
    _events.clear()
    _ahead.clear()
    _runs.clear()
    _outputs.clear()
    for kind in (PROGRAM, COLLECTIVE):
        _queues[kind] = queue.SimpleQueue()
        _waiters.append(threading.Thread(target=_wait_loop, args=(_queues[kind],),
                                         daemon=True, name="torch_pjrt profiler"))
        _waiters[-1].start()
    # The waiter takes a program's end once it holds the GIL again: ask the recording
    # thread to let go of it every 0.1 ms instead of every 5 ms.
    _switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(_switch_interval, 1e-4))
    active = True
    watch.set_profiling(True)


def _bound_ends(runs: list[_Run]) -> None:
    """Correct ends the waiters saw late. A waiter takes an end once it holds the GIL, so
    it can see a program end after a collective that read its outputs had ended; the
    collective's end is then the better bound for it. A device ends its compute programs
    in launch order, so each is bounded by the end of the one after it too."""
    for r in runs:
        for d in r.after:
            if r.end and d.end > r.end:
                d.end = r.end
    next_end: dict[int, int] = {}
    for r in reversed(runs):
        if r.kind == PROGRAM and r.end:
            if r.device in next_end and r.end > next_end[r.device]:
                r.end = next_end[r.device]
            next_end[r.device] = r.end


def _stop() -> list[tuple]:
    """The profile stops (Session::stop): every activity, device start times resolved."""
    global active
    active = False
    watch.set_profiling(False)
    for q in _queues.values():
        q.put(None)
    for waiter in _waiters:
        waiter.join(_STOP_TIMEOUT)
    _queues.clear()
    _waiters.clear()
    if _switch_interval is not None:
        sys.setswitchinterval(_switch_interval)
    events = list(_events)
    runs = sorted(_runs, key=lambda r: r.launched)
    _bound_ends(runs)
    last_end: dict[tuple[int, int], int] = {}
    for r in runs:
        end = r.end or now()
        track = (r.device, _STREAMS[r.kind])
        start = max(r.launched, min(max([last_end.get(track, 0)]
                                        + [d.end or end for d in r.after]), end))
        last_end[track] = max(end, last_end.get(track, 0))
        events.append((r.kind, r.name, start, max(end, start + 1), r.device,
                       _STREAMS[r.kind], r.link, r.meta))
    _events.clear()
    _runs.clear()
    _outputs.clear()
    return events
