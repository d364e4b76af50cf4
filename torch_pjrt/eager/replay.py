"""Replayed graphs: a function recorded once in fused eager, then run again on new
argument buffers without running its Python code: fused eager's counterpart of CUDA graphs.

A serving step calls the same model code with inputs of the same sizes thousands of times;
recording its ops costs the host more than the device takes to run the program they
compile to (a tiny Llama's vLLM step: 2.5 ms of recording for a 2.5 ms program). A Replay
keeps the flushed graph (graph.Ran): which of its input buffers came from the function's
arguments and which from tensors that outlive it (weights, a KV cache: "state"), which
storages took its outputs (the state it wrote in place, the results it returned).
Running it again reads the arguments' and the state's current buffers, runs the same
schedule, gives the written state its new buffers and returns new result tensors.

The contract is CUDA graphs': the function's ops and their Python numbers depend only on
the arguments' sizes (the caller keys its replays by them); everything else it reads is
state whose buffers may change but whose tensors stay. `capture` refuses (returns no
Replay, with the reason) what it cannot replay: ops outside fused eager, a flush inside
the function (a value read on the host), an input no live tensor holds, a new tensor
kept alive besides the results. `Replay.same_as` compares two captures (structure,
Python numbers, the state read), so that a caller replays only what recorded twice alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import counters
from ..storage import table
from . import graph, modes


class Replay:
    """A captured graph, run again by calling it with new arguments (tensors of the
    sizes and dtypes captured, in the same order)."""

    def __init__(self, ran: graph.Ran, sources: list, targets: list, results: list,
                 args: tuple):
        self.ran = ran
        self.args = args  # signature(args) of the capture
        self.sources = sources  # per input: ("arg", i) or ("state", handle, record)
        self.targets = targets  # per output: ("arg", i, k), ("state", handle, record, k)
        # or ("result", j, k)
        self.results = results  # per result: (shape, stride, dtype, record dtype, nbytes)

    def same_as(self, other: Replay) -> bool:
        """Whether `other` recorded the same graph on the same state (then both replay
        alike: what a caller checks before trusting a key with replays)."""
        a, b = self.ran, other.ran
        if a.key != b.key or a.device != b.device or len(a.dyn) != len(b.dyn) or \
                self.args != other.args:
            return False
        for x, y in zip(a.dyn, b.dyn):
            if type(x) is not type(y) or not isinstance(x, (int, float, bool, complex)) \
                    or x != y:
                return False
        return _identity(self.sources) == _identity(other.sources) and \
            _identity(self.targets) == _identity(other.targets)

    def __call__(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        """The function's results on `args`, its state updated, without recording."""
        if signature(args) != self.args:
            raise ValueError("pjrt replay: the arguments differ from the capture's (sizes, "
                             "strides, offsets, dtypes, or which of them share a storage): "
                             f"{signature(args)} against {self.args}")
        if graph.pending:
            graph.flush("replay")  # what is pending may read the state this overwrites
        graph._native.lock_ops()
        try:
            return self._run(args)
        finally:
            graph._native.unlock_ops()

    def _run(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        ran = self.ran
        arg_records = [table.record_of(a) for a in args]
        inputs = []
        for src in self.sources:
            if src[0] == "arg":
                inputs.append(arg_records[src[1]].get())
            else:
                _, handle, rec = src
                if not table.holds(handle, rec):
                    raise RuntimeError("pjrt replay: a tensor the captured function read "
                                       "(a weight, a cache) was freed or replaced since the "
                                       "capture; capture the function again")
                inputs.append(rec.get())
        counters.count("graph_replays")
        values = graph.run_plan(ran.plan, inputs, ran.dyn, ran.device, ran.nodes)
        fresh: dict[int, Any] = {}
        for target in self.targets:
            if target[0] == "arg":
                arg_records[target[1]].value = values[target[2]]
            elif target[0] == "state":
                target[2].value = values[target[3]]
            else:
                fresh[target[1]] = values[target[2]]
        return [table.new_tensor(shape, stride, dtype, rdtype, nbytes, ran.device, fresh[j])
                for j, (shape, stride, dtype, rdtype, nbytes) in enumerate(self.results)]


def signature(args: list[torch.Tensor]) -> tuple:
    """What a graph recorded from `args` depends on besides their values: each one's
    size, strides, offset, dtype, its storage's size, and the first argument sharing its
    storage. A replay runs only on arguments of its capture's signature."""
    first: dict[int, int] = {}
    return tuple((tuple(a.shape), a.stride(), a.storage_offset(), a.dtype,
                  a.untyped_storage().nbytes(),
                  first.setdefault(a.untyped_storage().data_ptr(), i))
                 for i, a in enumerate(args))


def _identity(entries: list) -> list:
    return [(e[0], *(id(x) if isinstance(x, table.StorageRecord) else x for x in e[1:]))
            for e in entries]


def capture(fn: Callable[[], Any], args: list[torch.Tensor]
            ) -> tuple[Any, Replay | None, str | None]:
    """Runs `fn()` (which reads `args`, pjrt tensors) in fused eager as one graph, run at
    its end: its result (a tensor or a tuple or list of them), a Replay of it (None where
    it cannot be replayed) and the reason it cannot (else None)."""
    if not modes.fused:
        return fn(), None, "the eager mode is not fused"
    graph.flush("capture")  # what came before is not the function's
    described = signature(args)
    arg_index: dict[int, int] = {}
    for i, a in enumerate(args):
        arg_index.setdefault(id(table.record_of(a)), i)
    flushes = counters.value("flushes")
    result = fn()
    tensors = [result] if isinstance(result, torch.Tensor) else list(result)
    if counters.value("flushes") != flushes:
        return result, None, "the function ran a graph before its end (a value read?)"
    live = table.live_handles()
    holders = {id(r.value): (h, r) for h, r in live
               if r.value is not None and not getattr(r.value, "pending", False)}
    handles = {id(r): h for h, r in live}
    kept: list[graph.Ran] = []
    graph.flush("capture", keep=kept)
    if not kept:
        return result, None, "the function recorded no op"
    ran = kept[0]
    sources = []
    for v in ran.inputs:
        rec = ran.superseded.get(id(v))
        handle = handles.get(id(rec)) if rec is not None else None
        if rec is None and id(v) in holders:
            handle, rec = holders[id(v)]
        if rec is None or handle is None:
            return result, None, "it reads a buffer that no live tensor holds"
        sources.append(("arg", arg_index[id(rec)]) if id(rec) in arg_index
                       else ("state", handle, rec))
    result_index = {}
    specs = []
    for j, t in enumerate(tensors):
        rec = table.record_of(t)
        if (id(rec) in result_index or t.storage_offset() != 0 or not t.is_contiguous() or
                t.numel() * t.element_size() != rec.nbytes):
            return result, None, "a result is a view, or shares its storage"
        result_index[id(rec)] = j
        specs.append((tuple(t.shape), tuple(t.stride()), t.dtype, rec.dtype, rec.nbytes))
    targets = []
    written = {id(r) for r in ran.superseded.values()}
    for rec, k in ran.targets:
        if id(rec) in arg_index:
            targets.append(("arg", arg_index[id(rec)], k))
        elif id(rec) in result_index:
            targets.append(("result", result_index[id(rec)], k))
        elif id(rec) in written and id(rec) in handles:
            targets.append(("state", handles[id(rec)], rec, k))
        else:
            return result, None, "it keeps a new tensor alive besides its results"
    if len({t[1] for t in targets if t[0] == "result"}) != len(tensors):
        return result, None, "a result is not computed by the graph"
    # the capture's buffers are not kept: a replay reads its arguments' and state's own
    # (its nodes are kept for their names and lines of code only)
    ran.inputs = ran.superseded = ran.targets = None
    for node in ran.nodes:
        node.inputs = None
    return result, Replay(ran, sources, targets, specs, described), None
