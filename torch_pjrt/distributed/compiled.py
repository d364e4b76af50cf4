"""Compiled graphs with collectives: one SPMD program over the process group's devices.

A torch.compile graph holding functional collectives (DTensor's, or the user's) runs as
one XLA program that every rank of the group launches: shard_map over the group's mesh,
each rank's inputs its block, the collectives XLA's (lowerings.py). compile/graph.py asks
here (graph.program_hooks) for every graph it builds; a graph without collectives is
left to it. Such a program runs outside the eager executor, after the pending fused
graph and after the ranks agreed on it, like any other collective (process_group.py).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..compile import graph
from ..storage import views
from . import buffers, lowerings


def _group_name(node) -> str:
    schema = node.target._schema
    names = [a.name for a in schema.arguments]
    return node.args[names.index("group_name")] if "group_name" in names and \
        names.index("group_name") < len(node.args) else node.kwargs["group_name"]


def build(gm: torch.fx.GraphModule, fn, placeholders: list, outputs: list, mutations: dict,
          random: bool, symbolic: bool):
    """graph.program_hooks: the SPMD runner of a graph with collectives, else None."""
    groups = {_group_name(n) for n in gm.graph.nodes
              if n.op == "call_function" and n.target in lowerings.OPS}
    if not groups:
        return None
    if len(groups) > 1:
        raise graph.Unsupported(f"collectives of {len(groups)} process groups in one graph")
    if random:
        raise graph.Unsupported("random numbers in a graph with collectives")
    if symbolic:
        raise graph.Unsupported("collectives in a graph with dynamic sizes")
    runner = SpmdGraph(groups.pop(), fn, [p.meta.get("val") for p in placeholders],
                       [o.meta["val"] for o in outputs], sorted(mutations))
    runner.desc = "compiled graph with " + "; ".join(
        _describe(n) for n in gm.graph.nodes
        if n.op == "call_function" and n.target in lowerings.OPS)
    return runner


def _describe(node) -> str:
    """A collective of a graph as the agreement compares it (the same on every rank)."""
    metas = node.meta.get("val")
    metas = metas if isinstance(metas, (list, tuple)) else [metas]
    shapes = ", ".join(f"{str(m.dtype).removeprefix('torch.')}{list(m.shape)}" for m in metas
                       if isinstance(m, torch.Tensor))
    params = [a for a in node.args[1:] if isinstance(a, (int, str)) and a != _group_name(node)]
    return f"{node.target.__name__.split('.')[0]}({shapes}{''.join(f', {p}' for p in params)})"


class SpmdGraph:
    """Runs a graph's interpreter as an SPMD program of its process group."""

    def __init__(self, group_name: str, fn, metas: list, out_metas: list, mutated: list[int]):
        self.group_name = group_name
        self.fn = fn
        self.metas = metas
        self.out_metas = out_metas
        self.mutated = mutated
        self.name = "?"  # the graph's operator name (compile/graph.py sets it)
        self.desc = "compiled graph"

    def __call__(self, args: list) -> list[torch.Tensor]:
        """The graph's computed outputs; mutated inputs written back."""
        from .process_group import ProcessGroupPjrt

        group = dist.distributed_c10d._resolve_process_group(self.group_name)
        if not isinstance(group, ProcessGroupPjrt):
            raise RuntimeError(f"pjrt: a compiled graph's collectives use process group "
                               f"{self.group_name!r} of backend {group.name()!r}; compiled "
                               "collectives of pjrt tensors need a 'pjrt' group")
        group._begin(self.desc)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        statics = tuple(a if not isinstance(a, torch.Tensor) else None for a in args)
        shapes = tuple(tuple(t.shape) for t in tensors)
        flats = [buffers.flat(t) for t in tensors]
        results = group._xla.run_body(("graph", id(self), statics, shapes),
                                      lambda: self._body(statics, shapes, group.size()), flats)
        device = group._device
        for i, value in zip(self.mutated, results):
            buffers.write(args[i], value)
        outs = []
        for m, value in zip(self.out_metas, results[len(self.mutated):]):
            shape, stride = tuple(m.shape), tuple(m.stride())
            t = buffers.wrap(value, shape, m.dtype, device)
            if stride != views.contiguous_strides(shape) and math.prod(shape) > 1:
                t = torch.empty_strided(shape, stride, dtype=m.dtype, device=t.device).copy_(t)
            outs.append(t)
        return outs

    def _body(self, statics: tuple, shapes: tuple, size: int):
        fn = self.fn

        def body(*blocks):
            blocks = iter(blocks)
            shapes_ = iter(shapes)
            inputs = [next(blocks).reshape(next(shapes_)) if s is None else s for s in statics]
            lowerings._size.append(size)
            try:
                *new_inputs, outs = fn(*inputs)
            finally:
                lowerings._size.pop()
            return [v.reshape(-1) for v in (*new_inputs, *outs)]

        return body
