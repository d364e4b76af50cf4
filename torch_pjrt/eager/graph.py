"""Fused eager: ops recorded into a pending graph, compiled and run as one program.

Recording an op costs what strict mode costs minus the launch: its output
storages get `Lazy` placeholders instead of buffers (the native kernel of lowered
ops, runtime/native/op_kernel.cpp, records the common cases, ops returning one fresh
tensor or writing one argument in place, without Python code). When a value is needed
(data read, CPU fallback, synchronize, a size cap) the graph is flushed: the
program takes the concrete buffers the graph reads and returns only the lazy
values some storage still holds, so tensors that died inside the graph are
never materialized and XLA fuses across ops. Programs are cached by structure
(each op's cache key and the wiring between ops), with input buffers as
placeholders, so every identical training step reuses one executable; storage
buffers the graph overwrites are donated.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .. import _env, counters
from ..lowering import checks
from ..runtime import compile_pool, device_trace, watch
from ..storage import table
from . import loops, recompiles, schedule, tiers


class Lazy:
    """A value a pending op will produce: output `index` of `node`."""

    __slots__ = ("node", "index", "shape", "dtype")
    pending = True  # what StorageRecord.get() checks before handing out a buffer

    def __init__(self, node: Node, index: int, shape: tuple, dtype: np.dtype):
        self.node = node
        self.index = index
        self.shape = shape
        self.dtype = dtype


class Lost:
    """What a storage holds once the fused graph computing its value failed: the value
    never existed, so reading it, or running an op on it, raises that graph's error."""

    __slots__ = ("error",)
    pending = True  # StorageRecord.get() flushes, finds it still not computed, and raises

    def __init__(self, error: Exception):
        self.error = error

    def fail(self):
        raise RuntimeError(f"pjrt: this tensor has no value: the fused graph that computes it "
                           f"failed ({self.error})") from self.error

    def __repr__(self) -> str:
        return f"<no value: its fused graph failed ({self.error})>"


class Node:
    """One recorded op: its compiled entry, its inputs (arrays, Lazy or None), its scalars."""

    __slots__ = ("entry", "inputs", "dyn", "position")

    def __init__(self, entry, inputs: list, dyn: list, position: int):
        self.entry = entry
        self.inputs = inputs
        self.dyn = dyn
        self.position = position


_nodes: list[Node] = []
_superseded: dict[int, object] = {}  # id of a concrete buffer a pending op replaced -> the
# storage record it belonged to
_device: int | None = None
pending = False  # read on every strict op: is there anything to flush?
max_ops = 10000  # graph size cap (TORCH_PJRT_FUSED_MAX_OPS), set by configure()
split_backward = True  # TORCH_PJRT_FUSED_SPLIT_BACKWARD, set by configure()
_task = -1  # the autograd graph task the last op was recorded in (-1: none, no backward)


_native = None  # the shim: its op lock (runtime/native/shim.h), set by configure()


def configure() -> None:
    global max_ops, split_backward, _native
    from .. import runtime
    from ..runtime import memory

    max_ops = int(_env.get("TORCH_PJRT_FUSED_MAX_OPS") or 10000)
    split_backward = _env.flag("TORCH_PJRT_FUSED_SPLIT_BACKWARD")
    tiers.configure()
    loops.configure()
    memory.on_pressure = _note_pressure
    _native = runtime.shim()


def _append(entry, recs: list, dyn: list, device: int, inputs) -> Node:
    """The op as the next node of the pending graph (run the graph first if it is for
    another device, or if this op starts a backward pass: see _backward_starts)."""
    global pending, due, _device
    if _backward_starts() and _nodes:
        flush("backward")
        inputs = None
    if device != _device:
        if _device is not None:
            flush("device change")
            inputs = None  # the flush gave pending storages their buffers
        _device = device
    if inputs is None:
        inputs = [recs[i].value for i in entry.order]
    node = Node(entry, inputs, dyn, len(_nodes))
    _nodes.append(node)
    if watch.op_sites:
        watch.noted_op(node)
    pending = True
    if len(_nodes) >= max_ops:
        due = True
    return node


def _backward_starts() -> bool:
    """Whether the op being recorded starts a backward pass after ops outside any (an
    autograd graph task after none; a backward nested in another, as reentrant
    checkpointing runs, starts nothing). Flushing there makes a training step two
    programs, the forward and the backward with what follows it (the optimizer step):
    the device runs the forward while the host records the backward, and on XLA:CPU the
    two took 8-20% less time than one graph across both (docs/xla-cpu-performance.md).
    op_kernel.cpp leaves an op to the Python side when the task changed."""
    global _task
    task = torch._C._current_graph_task_id()
    if task == _task:
        return False
    starts = _task == -1
    _task = task
    return starts and split_backward


def record(entry, recs: list, dyn: list, device: int, inputs=None) -> list[Lazy]:
    """Append an op to the pending graph; its results are Lazy placeholders. `inputs`: the
    records' values in `entry.order`, where the caller has them. op_kernel.cpp's
    record_in_place does this and launch.outputs for in-place ops (keep them alike)."""
    node = _append(entry, recs, dyn, device, inputs)
    for buf in entry.written:
        old = recs[buf].value
        if old is not None and type(old) is not Lazy:
            _superseded.setdefault(id(old), recs[buf])
    return [Lazy(node, i, shape, dtype) for i, (shape, dtype) in enumerate(entry.result_avals)]


def record_single(entry, recs: list, dyn: list, device: int, inputs) -> torch.Tensor:
    """record() of an op that returns one fresh tensor and writes nothing: that tensor.
    op_kernel.cpp's record_single does the same (keep the two alike); it leaves the cases
    that need more than appending (another device's graph, memory pressure) to this."""
    node = _append(entry, recs, dyn, device, inputs)
    shape, stride, dtype, jdtype, nbytes = entry.outs[0]
    return table.new_tensor(shape, stride, dtype, jdtype, nbytes, device,
                            Lazy(node, 0, *entry.result_avals[0]))


_pressure = False  # an allocation passed memory.PRESSURE of the limit while recording
due = False  # flush_reason() is not None: read after each recorded op


def _note_pressure() -> bool:
    """memory.on_pressure: remember it; the graph runs once the current op is recorded."""
    global _pressure, due
    _pressure = bool(_nodes)
    due = due or _pressure
    return False


def flush_due() -> None:
    """Run the graph a recorded op made due (the size cap or memory pressure)."""
    flush(flush_reason() or "size cap")


def flush_reason() -> str | None:
    """Why the pending graph should run now (checked after each recorded op), if it should."""
    if len(_nodes) >= max_ops:
        return "size cap"
    if _pressure:
        return "memory pressure"
    return None


# ------------------------------------------------------------------ flushing
_plans: dict[tuple, schedule.Schedule] = {}  # graph structure -> how it runs


def take_compiled() -> None:
    """Take the fused programs compiled in the background since the last flush into use."""
    _native.lock_ops()
    try:
        compile_pool.poll()
    finally:
        _native.unlock_ops()


def forget() -> None:
    """Drop every graph's schedule and program (the next flushes load them from disk)."""
    _plans.clear()
    schedule.programs.clear()


def flush(reason: str = "sync", keep: list | None = None) -> None:
    """Compile (or reuse) and run the pending graph; pending storages get their buffers.
    Under the op lock, as every op is: the graph is the process's, threads take turns.
    `keep`: a list that gets the Ran of the graph (eager/replay.py runs it again)."""
    if _native is None:  # the runtime has not started: no op was recorded
        return
    _native.lock_ops()
    try:
        _flush(reason, keep)
    finally:
        _native.unlock_ops()


class Ran:
    """A flushed graph as it ran: its schedule, the buffers it read (`inputs`), its
    run-time values, its nodes, which storage took each output (`targets`: record, index
    into the outputs) and the storages whose old buffers it overwrote (`superseded`)."""

    __slots__ = ("key", "plan", "inputs", "dyn", "device", "nodes", "targets", "superseded")

    def __init__(self, key, plan, inputs, dyn, device, nodes, targets, superseded):
        self.key, self.plan, self.inputs, self.dyn = key, plan, inputs, dyn
        self.device, self.nodes, self.targets, self.superseded = device, nodes, targets, \
            superseded


def _flush(reason: str, keep: list | None = None) -> None:
    global pending, _device, _pressure, due
    _pressure = due = False
    if not _nodes:
        pending = False
        return
    nodes = list(_nodes)
    _nodes.clear()
    # The graph's outputs: pending values some live storage still holds.
    records = [r for r in table.live_records() if type(r.value) is Lazy]
    superseded = dict(_superseded)
    _superseded.clear()
    device = _device
    pending = False
    _device = None
    counters.count("flushes")
    counters.count(f"flushes.{reason}")
    tiers.epoch += 1
    began = device_trace.now() if watch.profiling else 0
    try:
        _run_graph(nodes, records, superseded, device, keep)
    except Exception as e:
        for rec in records:  # a later read raises this error instead of finding a stale Lazy
            if type(rec.value) is Lazy:
                rec.value = Lost(e)
        raise
    finally:
        if began:
            device_trace.host(f"pjrt flush: {reason}", began, {"ops": len(nodes)})
        if watch.node_sites:
            for node in nodes:
                watch.node_sites.pop(id(node), None)


def _run_graph(nodes: list[Node], records: list, superseded: dict, device: int,
               keep: list | None = None) -> None:
    """flush(), once the pending state is taken: prune, key, compile or reuse, run (a Ran
    of it appended to `keep`, where given: then never as a lone op's program)."""
    # Keep only the ops whose results are still needed (or that check data).
    live = [False] * len(nodes)
    for rec in records:
        live[rec.value.node.position] = True
    for node in reversed(nodes):
        if not live[node.position] and not node.entry.checked:
            continue
        live[node.position] = True
        for v in node.inputs:
            if type(v) is Lazy:
                live[v.node.position] = True
    kept = [n for n in nodes if live[n.position]]
    counters.count("graph_ops", len(kept))
    counters.count("graph_ops_pruned", len(nodes) - len(kept))
    if len(kept) == 1 and keep is None and _run_alone(kept[0], records, superseded):
        return
    renumber = {n.position: i for i, n in enumerate(kept)}

    # Wiring: concrete inputs become placeholders, lazy inputs point at producers.
    in_slots: dict[int, int] = {}
    inputs: list = []
    wiring = []
    dyn: list = []
    donated: list[int] = []
    for node in kept:
        refs = []
        for v in node.inputs:
            if v is None:
                refs.append(None)
            elif type(v) is Lazy:
                refs.append((renumber[v.node.position], v.index))
            else:
                if type(v) is Lost:
                    v.fail()
                slot = in_slots.get(id(v))
                if slot is None:
                    slot = in_slots[id(v)] = len(inputs)
                    inputs.append(v)
                    if id(v) in superseded:
                        donated.append(slot)
                refs.append(slot)
        wiring.append((node.entry, tuple(refs), len(node.dyn)))
        dyn.extend(node.dyn)
    # A storage's new value first, in the order its old buffer is donated: JAX pairs each
    # output with the first unused donated input of its shape, and a storage paired with
    # another's buffer makes XLA copy both (both old values live to the end).
    rank = {}
    for slot in donated:
        rank.setdefault(id(superseded[id(inputs[slot])]), len(rank))
    records.sort(key=lambda r: rank.get(id(r), len(rank)))
    outputs = []
    out_index: dict[tuple[int, int], int] = {}
    for rec in records:
        lz = rec.value
        ref = (renumber[lz.node.position], lz.index)
        if ref not in out_index:
            out_index[ref] = len(outputs)
            outputs.append(ref)
    counters.count("graph_outputs", len(outputs))
    key = (tuple(wiring), tuple(outputs), tuple(donated), device,
           tuple(type(d) for d in dyn))
    plan = _plans.get(key)
    if plan is None:
        counters.count("graph_cache_misses")
        # The same sequence of ops with different inputs: a recompile worth telling.
        names = [e.name for e, _, _ in wiring]
        label = f"a fused graph of {len(names)} ops ({', '.join(names[:3])}, ...)"
        varying = recompiles.note(tuple(names), tuple(e.signature for e, _, _ in wiring),
                                  label, "fused", "op")
        plan = _plans[key] = schedule.plan(wiring, outputs, donated, len(inputs), device,
                                           key[-1], key, kept, varying)
    else:
        counters.count("graph_cache_hits")
    targets = [(rec, out_index[(renumber[rec.value.node.position], rec.value.index)])
               for rec in records]
    compile_pool.poll()  # fused programs compiled in the background since the last flush
    values = run_plan(plan, inputs, dyn, device, kept)
    for rec, index in targets:
        rec.value = values[index]
    if keep is not None:
        keep.append(Ran(key, plan, inputs, dyn, device, kept, targets, superseded))


def run_plan(plan: schedule.Schedule, inputs: list, dyn: list, device: int,
             nodes: list[Node]) -> list:
    """A graph's output values: its schedule run on `inputs` (an error names its ops)."""
    try:
        return plan.run(inputs, dyn, device, nodes)
    except Exception as e:  # noqa: BLE001
        names = ", ".join(dict.fromkeys(n.entry.name for n in nodes))
        raise RuntimeError(f"pjrt: a fused graph of {len(nodes)} ops failed on the device "
                           f"(ops: {names}): {e}") from e


def _run_alone(node: Node, records: list, superseded: dict) -> bool:
    """A graph of one op runs that op's own program (the one strict mode launches, shared
    with it in memory and on disk) instead of compiling a graph for it: code that reads a
    value after every op compiles once per op signature, as in strict mode. False (and
    nothing run) where the op's program would donate a buffer the graph would not."""
    entry = node.entry
    inputs = node.inputs
    for v in inputs:
        if type(v) is Lost:
            v.fail()
    if entry.fn is None or any(id(inputs[i]) not in superseded
                               for i in range(len(entry.donate))):
        return False
    from .scalars import device_scalar

    counters.count("graph_single_ops")
    launcher = entry.fn
    miss = launcher.compiled is None
    start = time.perf_counter() if miss else 0.0
    dyn = [device_scalar(v, entry.device) for v in node.dyn]
    try:
        if watch.profiling:
            results = device_trace.launch(
                launcher.launch, entry.digest, entry.device, [inputs, dyn],
                inputs[:len(entry.donate)], [(entry.name, watch.node_sites.get(id(node)))])
        else:
            results = launcher.launch(inputs, dyn)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"pjrt: a fused graph of 1 op failed on the device (op: "
                           f"{entry.name}): {e}") from e
    if miss:
        counters.count("compiles")
        counters.add_compile_time(time.perf_counter() - start)
    for rec in records:
        rec.value = results[rec.value.index]
    if entry.checks is not None:
        checks.defer(results[-1], entry.checks, entry.name)
    return True


def pending_ops() -> int:
    return len(_nodes)
