"""How a pending graph runs: in pieces (the whole graph; or a loop's prefix, its steps and
the rest, eager/loops.py), each by its fused program once that is compiled, else op by op
on the ops' own programs while the fused one compiles (eager/tiers.py).

A graph is described by its wiring (graph._run_graph): per node its op entry, its inputs
(None, an input slot of the graph, or (node, output) of an earlier node) and how many
run-time values it takes; and its outputs, (node, output) each. A piece is a stretch of
nodes: its inputs are the graph's inputs and earlier pieces' results that it reads, its
outputs what later pieces or the graph's outputs read. Pieces of the same structure (the
steps of a loop) share one program: its outputs are what any of them must return, and
it donates an input only where every one of them may."""

from __future__ import annotations

from .. import counters
from ..lowering import checks
from ..runtime import compile_cache, compile_pool, device_trace, watch
from . import loops, tiers
from .program import Program, build
from .scalars import device_scalar

programs: dict[tuple, Program] = {}  # piece structure -> its program, shared by graphs


class Piece:
    """A stretch of a graph's nodes with the program that computes it."""

    __slots__ = ("program", "start", "stop", "sources", "wiring", "outputs", "local_outputs",
                 "dyn", "order", "donated", "per_op", "drop", "free", "recurs", "left")

    def __init__(self, start: int, stop: int):
        self.start = start
        self.stop = stop
        self.program: Program | None = None
        self.sources: list = []  # per input: a slot of the graph's inputs or a (node, output)
        self.wiring: list = []  # (entry, refs in the piece's own numbering, run-time values)
        self.local_outputs: list[tuple] = []  # (node, output) in the piece, in program order
        self.outputs: list[tuple] = []  # the same in the graph's numbering
        self.dyn = (0, 0)  # the graph's run-time values it takes
        self.donated: list[int] = []  # inputs the program donates
        self.order: list[int] = []  # inputs in the program's argument order
        self.per_op = False  # may run op by op (tiers.py): every op has its own program
        # and none of them donates a buffer something after it reads
        self.drop: list[list[int]] = []  # per node: nodes whose results are dead after it
        self.free: list[tuple] = []  # graph values no later piece reads
        # Its program wanted again within one flush (a loop's next step, the next layer)
        # counts as a recurrence (tiers.fused_now): not where the graph's shapes change
        # from flush to flush (a dynamic KV cache's step): its program is not seen again.
        self.recurs = False
        self.left = 0  # later pieces of its graph that run the same program

    def run(self, args: list, dyn, device: int, nodes: list) -> list:
        """Its outputs' values from its inputs' (`args`) and run-time values."""
        prog = self.program
        if prog.compiled is None and not tiers.fused_now(self, args, dyn):
            return tiers.run_ops(self, args, dyn, device, nodes)
        ordered = [args[i] for i in self.order]
        # run-time numbers as cached device arrays: passed as Python numbers, every run
        # would copy each to the device (44 copies, 0.35 ms of a vLLM step's host time)
        dyn = [device_scalar(v, device) for v in dyn]
        if watch.profiling:
            results = device_trace.launch(
                prog, prog.name, device, [*ordered, *dyn], [args[i] for i in self.donated],
                [(n.entry.name, watch.node_sites.get(id(n)))
                 for n in nodes[self.start:self.stop]])
        else:
            results = prog(*ordered, *dyn)
        values, flags = results
        for position, f in zip(prog.flag_nodes, flags):
            entry = self.wiring[position][0]
            checks.defer(f, entry.checks, entry.name)
        return values


# A loop's graph of at most this many ops compiles whole too, in the background once its
# pieces are compiled, and runs as one program from then on: what it ran as before loops
# were cut (the steady state stays the same); longer ones keep their pieces.
WHOLE_MAX_OPS = 3000


class Schedule:
    """The pieces of one graph structure, in order (and the whole graph as one piece, once
    that is compiled)."""

    __slots__ = ("pieces", "outputs", "unrolled", "whole", "ran")

    def __init__(self, pieces: list[Piece], outputs: list[tuple], unrolled: tuple | None):
        self.pieces = pieces
        self.outputs = outputs
        self.unrolled = unrolled  # plan()'s arguments for the whole graph, where it may
        self.whole: Piece | None = None
        self.ran = False

    def run(self, inputs: list, dyn: list, device: int, nodes: list) -> list:
        """The graph's outputs' values, in order, from its inputs and run-time values."""
        if len(self.pieces) == 1:
            return self.pieces[0].run(inputs, dyn, device, nodes)
        whole = self.whole
        # (where compiles block, the pieces are the programs for good: see tiers.blocking)
        if whole is None and self.unrolled is not None and not tiers.blocking():
            self.whole = whole = _single(*self.unrolled, nodes)
            # A warm process: an earlier one ran the pieces, then the whole graph's
            # program, which is on disk: load it at the first run rather than after the
            # pieces (it took a background load a flush later, ten steps of a training
            # loop, before).
            prog = whole.program
            if prog.compiled is None and not prog.looked and compile_cache.stored(prog.name):
                prog.load([*[inputs[i] for i in whole.order], *dyn])
        if whole is not None and whole.program.compiled is not None:
            return whole.run(inputs, dyn, device, nodes)
        if whole is not None and not tiers.blocking() and all(
                p.program.compiled is not None for p in self.pieces):
            prog = whole.program
            if prog.job is None and prog.failed is None:
                prog.compile_in_background([*[inputs[i] for i in whole.order], *dyn])
                counters.count("graph_loops_unrolling")
        if not self.ran:
            self.ran = True
            tiers.compile_early(self.pieces, inputs, dyn, nodes)
        store: dict[tuple, object] = {}
        for piece in self.pieces:
            # a step's fused program compiled since the last piece: its next steps run it
            compile_pool.poll()
            args = [inputs[s] if type(s) is int else store[s] for s in piece.sources]
            values = piece.run(args, dyn[piece.dyn[0]:piece.dyn[1]], device, nodes)
            for ref, value in zip(piece.outputs, values):
                store[ref] = value
            for ref in piece.free:
                del store[ref]
        tiers.compile_deferred()
        return [store[r] for r in self.outputs]


def plan(wiring: tuple, outputs: list, donated: list, n_inputs: int, device: int,
         dyn_types: tuple, key: tuple, nodes: list, varying: bool = False) -> Schedule:
    """The schedule of a graph structure (`key`: graph._run_graph's key of it; `nodes`:
    the graph's nodes, whose lines of user code describe the programs; `varying`: its
    ops ran with other shapes before)."""
    n = len(wiring)
    bounds = [0, *loops.cuts(wiring, outputs), n]
    whole = (wiring, outputs, donated, n_inputs, device, dyn_types, key)
    if len(bounds) == 2:
        return Schedule([_single(*whole, nodes)], list(outputs), None)
    counters.count("graph_loops")
    last = _last_readers(wiring)
    out_set = set(outputs)
    donated_set = set(donated)
    pieces = _cut(wiring, bounds, outputs, donated_set, n_inputs, last, out_set)
    at = 0
    dyn_at = [0]
    for w in wiring:
        at += w[2]
        dyn_at.append(at)
    for piece in pieces:
        piece.dyn = (dyn_at[piece.start], dyn_at[piece.stop])
        piece_key = (tuple(piece.wiring), tuple(piece.local_outputs), tuple(piece.donated),
                     device, dyn_types[piece.dyn[0]:piece.dyn[1]])
        piece.program = _program(piece_key, piece, device, piece_key[-1], nodes)
        piece.recurs = not varying
        _finish(piece, n_inputs, last, out_set, donated_set)
    seen: dict[int, int] = {}
    for piece in reversed(pieces):
        piece.left = seen.get(id(piece.program), 0)
        seen[id(piece.program)] = piece.left + 1
    return Schedule(pieces, list(outputs), whole if n <= WHOLE_MAX_OPS else None)


def _single(wiring: tuple, outputs: list, donated: list, n_inputs: int, device: int,
            dyn_types: tuple, key: tuple, nodes: list) -> Piece:
    """The whole graph as one piece."""
    piece = Piece(0, len(wiring))
    piece.sources = list(range(n_inputs))
    piece.wiring = list(wiring)
    piece.local_outputs = piece.outputs = list(outputs)
    piece.dyn = (0, sum(w[2] for w in wiring))
    piece.donated = list(donated)
    piece.program = _program(key, piece, device, dyn_types, nodes)
    _finish(piece, n_inputs, _last_readers(wiring), set(outputs), set(donated))
    return piece


def _program(key: tuple, piece: Piece, device: int, dyn_types: tuple, nodes: list):
    prog = programs.get(key)
    if prog is None:
        prog = programs[key] = build(piece.wiring, piece.local_outputs, len(piece.sources),
                                     piece.donated, device, dyn_types)
        names = [w[0].name for w in piece.wiring]
        watch.describe(prog.name, "graph",
                       f"a fused graph of {len(names)} ops ({', '.join(names[:3])}, ...)",
                       [(n.entry.name, n.entry.signature, watch.node_sites.get(id(n)))
                        for n in nodes[piece.start:piece.stop]])
    return prog


def _last_readers(wiring: tuple) -> dict:
    """The last node that reads each input slot and each node result."""
    last: dict = {}
    for i, (_, refs, _) in enumerate(wiring):
        for r in refs:
            if r is not None:
                last[r] = i
    return last


def _cut(wiring: tuple, bounds: list[int], outputs: list, donated_set: set, n_inputs: int,
         last: dict, out_set: set) -> list[Piece]:
    """The pieces between `bounds`: their inputs, outputs and donations, made alike across
    pieces of the same structure."""
    piece_at = []
    for p, (a, b) in enumerate(zip(bounds, bounds[1:])):
        piece_at.extend([p] * (b - a))
    # The piece each value is read in last, and the values each piece must return.
    last_piece = {v: piece_at[i] for v, i in last.items()}
    # Each piece's values read in a later piece or returned (one pass, not one per piece).
    kept_after: list[set] = [set() for _ in range(len(bounds) - 1)]
    for r, q in last_piece.items():
        if type(r) is tuple and piece_at[r[0]] < q:
            kept_after[piece_at[r[0]]].add(r)
    for r in out_set:
        kept_after[piece_at[r[0]]].add(r)
    groups: dict[tuple, list[tuple]] = {}
    drafts = []
    for p, (a, b) in enumerate(zip(bounds, bounds[1:])):
        piece = Piece(a, b)
        local: dict = {}
        for i in range(a, b):
            entry, refs, n_dyn = wiring[i]
            lrefs = []
            for r in refs:
                if r is None:
                    lrefs.append(None)
                elif type(r) is tuple and r[0] >= a:
                    lrefs.append((r[0] - a, r[1]))
                else:
                    slot = local.get(r)
                    if slot is None:
                        slot = local[r] = len(piece.sources)
                        piece.sources.append(r)
                    lrefs.append(slot)
            piece.wiring.append((entry, tuple(lrefs), n_dyn))
        needed = {(r[0] - a, r[1]) for r in kept_after[p]}
        donatable = {slot for slot, s in enumerate(piece.sources)
                     if last_piece[s] == p and
                     (s in donated_set if type(s) is int else s not in out_set)}
        signature = (tuple(piece.wiring), len(piece.sources))
        groups.setdefault(signature, []).append((piece, needed, donatable))
        drafts.append(piece)
    for members in groups.values():
        needed = set().union(*(m[1] for m in members))
        donatable = set.intersection(*(m[2] for m in members))
        for piece, _, _ in members:
            piece.donated = sorted(donatable)
            piece.local_outputs = _output_order(piece.wiring, needed, piece.donated)
            piece.outputs = [(j + piece.start, k) for j, k in piece.local_outputs]
    # Values in the store between pieces: dropped after the last piece that reads them.
    producer_piece = {}
    for piece, p in zip(drafts, range(len(drafts))):
        for ref in piece.outputs:
            producer_piece[ref] = p
    for ref, p in producer_piece.items():
        if ref not in out_set:
            drafts[max(p, last_piece.get(ref, p))].free.append(ref)
    return drafts


def _output_order(wiring: list, needed: set, donated: list[int]) -> list[tuple]:
    """A piece's outputs, each donated input's new value first in the donation order: JAX
    pairs each output with the first unused donated input of its shape, and a value paired
    with another's buffer makes XLA copy both."""
    replaced: dict = {}  # a value -> the value an in-place op writes over its buffer
    for i, (entry, refs, _) in enumerate(wiring):
        fresh = len(entry.result_avals) - len(entry.written)
        for k, buf in enumerate(entry.donate):
            if refs[k] is not None:
                replaced.setdefault(refs[k], (i, fresh + entry.written.index(buf)))
    first = []
    for slot in donated:
        v = slot
        while v in replaced:
            v = replaced[v]
        if v in needed and v not in first:
            first.append(v)
    return first + sorted(needed - set(first))


def _finish(piece: Piece, n_inputs: int, last: dict, out_set: set, donated_set: set) -> None:
    """The program's argument order; whether and how the piece can run op by op."""
    donated = piece.donated
    piece.order = donated + [i for i in range(len(piece.sources)) if i not in set(donated)]
    a = piece.start
    outputs = set(piece.local_outputs)
    per_op = all(w[0].fn is not None for w in piece.wiring)
    readers: dict[int, int] = {}  # node -> the last node in the piece that reads it
    for i, (entry, refs, _) in enumerate(piece.wiring):
        for k, r in enumerate(refs):
            if type(r) is tuple:
                readers[r[0]] = i
            if k < len(entry.donate) and r is not None and per_op:
                # the op's own program donates this value: nothing after it may read it
                v = piece.sources[r] if type(r) is int else (r[0] + a, r[1])
                per_op = (last.get(v) == i + a and v not in out_set and
                          (type(v) is not int or v in donated_set))
    piece.per_op = per_op
    returned = {o[0] for o in outputs}
    piece.drop = [[] for _ in piece.wiring]
    for j in range(len(piece.wiring)):
        if j not in returned:
            piece.drop[readers.get(j, j)].append(j)
