"""Tiered execution of fused eager: a graph piece whose fused program is not compiled runs
op by op on its ops' own programs (the ones strict mode runs: they exist, or compile in a
fraction of the time, side by side on every core) where that is cheaper than waiting for
the fused compile; the fused program compiles on a compile thread once the piece recurs (in
a later flush, or within the same one: a loop's step), and runs from its first occurrence
after it is ready. The rule and its figures: docs/compile-cost.md."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import jax
import torch

from .. import _env, counters
from ..lowering import checks
from ..runtime import client, compile_cache, compile_pool, device_trace, watch
from . import host_ops, op_cache
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
        return False
    fused_args = [*[args[i] for i in piece.order], *dyn]
    if blocking() or not piece.per_op:
        prog.compile_now(fused_args)  # (from the disk cache if it is there)
        return True
    if not prog.looked and prog.load(fused_args):
        return True
    if prog.failed is not None:
        return False
    if prog.wanted != epoch:
        prog.wanted = epoch
        prog.needs += 1
    elif piece.recurs:  # wanted again in this flush: a loop's step, a layer of a stack
        prog.needs = max(prog.needs, 2)
    if not _ops_cheaper(piece):
        prog.compile_now(fused_args)
        return True
    if prog.needs >= 2:  # it recurs (a second flush, or again in this one): worth a
        prog.compile_in_background(fused_args)  # compile nobody waits for
    return False


def _ops_cheaper(piece: Piece) -> bool:
    """Whether compiling the ops' missing programs (side by side on every core: their
    tracing takes turns) and launching them one by one costs less than PREFER_OPS times
    compiling the fused program."""
    missing = {id(w[0]): _launcher(w[0]) for w in piece.wiring
               if _launcher(w[0]).compiled is None}
    # (on disk, loaded: a warm process whose earlier pieces ran fused has loaded none of
    # their ops' programs, and would otherwise compile the next piece's fused program)
    stored = sum(compile_cache.stored(launcher.digest) for launcher in missing.values())
    ops = len(piece.wiring)
    by_ops = (stored * OP_LOAD + (len(missing) - stored) *
              (OP_LOWER + OP_COMPILE / compile_pool.threads()) + ops * OP_LAUNCH)
    return by_ops < PREFER_OPS * (GRAPH_COMPILE + ops * NODE_COMPILE)


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
