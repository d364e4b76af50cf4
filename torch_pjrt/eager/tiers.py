"""Tiered execution of fused eager: a graph piece whose fused program is not compiled runs
op by op on its ops' own programs (the ones strict mode runs: they exist, or compile in a
fraction of the time, side by side on every core) where that is cheaper than waiting for
the fused compile; the fused program compiles on a compile thread once the piece recurs (in
a later flush, or within the same one: a loop's step, whose compile starts with the flush,
or after it where the loop's core is better spent running it: _pays_now), and runs from its
first occurrence after it is ready. The rule and its figures: docs/compile-cost.md."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import jax
import torch

from .. import _env, counters
from ..lowering import checks
from ..runtime import client, compile_cache, compile_pool, device_trace, watch
from . import host_ops, op_cache
from .program import aval as array_aval
from .scalars import device_scalar

if TYPE_CHECKING:
    from .schedule import Piece

enabled = True  # TORCH_PJRT_TIERED, set by configure()

# What the choice weighs, in seconds of one core (XLA:CPU on the 2-core development
# machine, docs/compile-cost.md): tracing and lowering one op's own program, compiling it
# quickly (compile_cache.quick_options), launching it; compiling a fused program (a fixed
# part and a part per op). An op's program serves every later graph that has the op, a
# graph's program only that graph: running op by op is chosen unless it costs more than
# PREFER_OPS times the fused compile.
OP_LOWER = 0.016
OP_COMPILE = 0.023
OP_LOAD = 0.006  # an op's program from the disk cache (26-275 of them in 0.2-1.2 s)
OP_LAUNCH = 0.0001
GRAPH_COMPILE = 0.05
NODE_COMPILE = 0.0095
PREFER_OPS = 2.0

epoch = 0  # flushes so far (graph.py counts): a program is wanted at most once per flush


def configure() -> None:
    global enabled
    enabled = _env.flag("TORCH_PJRT_TIERED")


def blocking() -> bool:
    """Whether a fused program compiles (or loads) where it is first wanted and its graph
    runs it from then on, never op by op and never switching to another program later:
    tiered execution off (TORCH_PJRT_TIERED=0), or deterministic algorithms (results that
    do not depend on when a compile finished, to the last bit)."""
    return not enabled or torch.are_deterministic_algorithms_enabled()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait for the fused programs compiling in the background and take them into use, so
    that the next flushes run them (a benchmark's steady state starts here). False if
    `timeout` seconds passed first."""
    from . import graph

    done = compile_pool.wait(timeout)
    graph.take_compiled()
    return done


def fused_now(piece: Piece, args: list, dyn) -> bool:
    """Whether the piece runs its fused program now (loaded from disk or compiled first,
    here), or op by op (False: its fused program may be compiling meanwhile)."""
    prog = piece.program
    if prog.job is not None:  # compiling on a compile thread
        if not piece.recurs and piece.per_op:
            return False
        if _wait_for_fused(piece):
            return True
        if piece.per_op:
            return False
        # (it cannot run op by op, and that compile failed: compiled here, its error raised)
    fused_args = [*[args[i] for i in piece.order], *dyn]
    if blocking() or not piece.per_op:
        prog.compile_now(fused_args)  # (from the disk cache if it is there)
        return True
    if not prog.looked and prog.load(fused_args):
        return True
    if prog.failed is not None:
        return False
    first = prog.wanted != epoch
    if first:
        prog.wanted = epoch
        prog.needs += 1
    elif piece.recurs:  # wanted again in this flush: a loop's step, a layer of a stack
        prog.needs = max(prog.needs, 2)
    if not _ops_cheaper(piece):
        prog.compile_now(fused_args)
        return True
    if prog.needs >= 2:  # it recurs (a second flush, or again in this one): worth a
        # compile nobody waits for; where only this flush wants it again, beside the
        # flush where that pays, else after it
        if first or _pays_now(piece):
            prog.compile_in_background(fused_args)
        elif prog not in _deferred:
            _deferred[prog] = [array_aval(a) for a in fused_args]
    return False


# Fused programs of loop steps whose compile waits for the end of the flush (_pays_now).
_deferred: dict = {}  # Program -> the avals of its arguments


def _pays_now(piece: Piece, steps: int | None = None) -> bool:
    """Whether a loop step's fused program should compile beside the flush that runs the
    loop (`steps`: its occurrences still to run there), rather than after it. With cores
    to spare (four or more), yes; with fewer, the compile takes its core from the loop's
    op by op run (launches on PJRT's threads, the user's thread dispatching them): 1.3 s
    more for a 32-token generate's 2.7 s, measured on two cores. There it compiles beside
    the flush only where the loop's remaining steps, run op by op, would take longer than
    the compile; else once the flush is done (the next flush, or the next process, runs
    it from the disk cache)."""
    if compile_pool.threads() >= 4:
        return True
    left = piece.left if steps is None else steps
    return left * len(piece.wiring) * OP_LAUNCH > _fused_seconds(piece)


def compile_deferred() -> None:
    """At the end of a flush: start the compiles _pays_now put off."""
    if _deferred:
        jobs = list(_deferred.items())
        _deferred.clear()
        for prog, avals in jobs:
            if prog.compiled is None and prog.job is None and prog.failed is None:
                prog.compile_in_background(avals)


def compile_early(pieces: list[Piece], inputs: list, dyn, nodes: list) -> None:
    """At a graph's first run: the fused program of a step its loop repeats within the
    graph starts compiling on a compile thread now, while the pieces before it (a decode
    loop's prefill) run op by op, rather than at its second step, where that pays
    (_pays_now); where it is on disk, its first step loads it instead (fused_now).
    Tiered execution only."""
    if blocking():
        return
    started = set()
    for piece in pieces:
        prog = piece.program
        if (not piece.left or not piece.recurs or id(prog) in started
                or prog.compiled is not None or prog.job is not None
                or prog.failed is not None or not _pays_now(piece, piece.left + 1)
                or compile_cache.stored(prog.name)):
            continue
        started.add(id(prog))
        sharding = jax.sharding.SingleDeviceSharding(client.device(prog.device))
        avals = [array_aval(inputs[s]) if type(s) is int else
                 _aval(nodes[s[0]].entry.result_avals[s[1]], sharding)
                 for s in piece.sources]
        prog.compile_in_background([*[avals[i] for i in piece.order],
                                    *dyn[piece.dyn[0]:piece.dyn[1]]])
        counters.count("background_compiles_early")


def _wait_for_fused(piece: Piece) -> bool:
    """Whether the piece runs its fused program, compiling on a compile thread, after
    waiting for it: where the rest of that compile (priced as fused_now prices it, less
    what it has run) costs less than running the piece op by op (where it cannot run op
    by op, always). False where it does not wait, or the compile failed."""
    prog = piece.program
    job = prog.job
    if piece.per_op:
        ran = 0.0 if job.started is None else time.perf_counter() - job.started
        left = _fused_seconds(piece) - ran
        if left >= _ops_seconds(piece):
            return False
    start = time.perf_counter()
    compile_pool.wait_for(job)
    compile_pool.poll()
    counters.count("background_compiles_waited")
    counters.add_compile_time(time.perf_counter() - start)
    return prog.compiled is not None


def _ops_seconds(piece: Piece) -> float:
    """What running the piece op by op costs: compiling the ops' missing programs (side by
    side on every core: their tracing takes turns) and launching them one by one."""
    missing = {id(w[0]): _launcher(w[0]) for w in piece.wiring
               if _launcher(w[0]).compiled is None}
    # (on disk, loaded: a warm process whose earlier pieces ran fused has loaded none of
    # their ops' programs, and would otherwise compile the next piece's fused program)
    stored = sum(compile_cache.stored(launcher.digest) for launcher in missing.values())
    return (stored * OP_LOAD + (len(missing) - stored) *
            (OP_LOWER + OP_COMPILE / compile_pool.threads()) + len(piece.wiring) * OP_LAUNCH)


def _fused_seconds(piece: Piece) -> float:
    """What compiling the piece's fused program costs."""
    return GRAPH_COMPILE + len(piece.wiring) * NODE_COMPILE


def _ops_cheaper(piece: Piece) -> bool:
    """Whether running the piece op by op costs less than PREFER_OPS times compiling the
    fused program."""
    return _ops_seconds(piece) < PREFER_OPS * _fused_seconds(piece)


def run_ops(piece: Piece, args: list, dyn, device: int, nodes: list) -> list:
    """The piece's outputs, computed op by op on each op's own program (the one strict mode
    runs, with the same inputs and run-time values: random ops draw the same numbers)."""
    _prepare(piece, args, dyn, device)
    counters.count("tiered_pieces")
    counters.count("tiered_ops", len(piece.wiring))
    produced: list = [None] * len(piece.wiring)
    profiling = watch.profiling
    d = 0
    for i, (entry, refs, n_dyn) in enumerate(piece.wiring):
        a = [None if r is None else args[r] if type(r) is int else produced[r[0]][r[1]]
             for r in refs]
        values = [device_scalar(v, device) for v in dyn[d:d + n_dyn]] if n_dyn else []
        d += n_dyn
        launcher = _launcher(entry)
        res = None if launcher.compiled is not None else \
            host_ops.try_run(entry, epoch, a, values, device)
        if res is None:  # its program (compiled at its launch if need be)
            if profiling:
                node = nodes[piece.start + i]
                res = device_trace.launch(launcher.launch, launcher.digest, device,
                                          [a, values], a[:len(entry.donate)],
                                          [(entry.name, watch.node_sites.get(id(node)))])
            else:
                res = launcher.launch(a, values)
        if entry.checks is not None:
            checks.defer(res[-1], entry.checks, entry.name)
        produced[i] = res
        for j in piece.drop[i]:
            produced[j] = None
    return [produced[j][k] for j, k in piece.local_outputs]


def _prepare(piece: Piece, args: list, dyn, device: int) -> None:
    """Compile (or load) the programs of the piece's ops that have none yet, side by side."""
    todo = []
    seen = set()
    sharding = None
    d = 0
    for entry, refs, n_dyn in piece.wiring:
        launcher = _launcher(entry)
        if launcher.compiled is None and id(entry) not in seen:
            seen.add(id(entry))
            if sharding is None:
                sharding = jax.sharding.SingleDeviceSharding(client.device(device))
            a = [None if r is None else args[r] if type(r) is int else
                 _aval(piece.wiring[r[0]][0].result_avals[r[1]], sharding) for r in refs]
            values = [device_scalar(v, device) for v in dyn[d:d + n_dyn]]
            if host_ops.plan(entry, launcher, a, values, epoch) is None:
                todo.append((entry, a, values))
        d += n_dyn
    if not todo:
        return
    start = time.perf_counter()
    launchers = [_launcher(entry) for entry, _, _ in todo]
    built = compile_pool.parallel([launcher.obtain(a, values)
                                   for launcher, (_, a, values) in zip(launchers, todo)])
    for launcher, b in zip(launchers, built):
        launcher.take(b)
    counters.count("compiles", len(todo))
    counters.add_compile_time(time.perf_counter() - start)


def _launcher(entry):
    """The program an op runs on in a graph run op by op: its own, where it is compiled
    (strict mode ran it), else its quick one (compile_cache.quick_options)."""
    return entry.fn if entry.fn.compiled is not None else op_cache.quick(entry)


def _aval(aval: tuple, sharding):
    shape, dtype = aval
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
