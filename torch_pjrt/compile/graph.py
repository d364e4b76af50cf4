"""A compiled FX graph as one op: the whole graph is a lowering in the same table.

Each graph AOTAutograd hands us becomes a `pjrt_graphs::graph_<n>` operator
whose lowering interprets the FX graph node by node with the ops' own lowerings
(the same ones eager uses). Calling the operator goes through the eager
executor, so a compiled graph gets what every op gets: device buffers in and
out with PyTorch's strides, views of inputs read in place, mutated inputs
written back with donation, an in-memory and on-disk program cache, and, in
fused mode, fusion with the eager ops around it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import jax
import torch
import torch.fx

from ..eager import opspec
from ..lowering import apply, registry
from ..storage import dtypes

_lib = torch.library.Library("pjrt_graphs", "DEF")
_impl = torch.library.Library("pjrt_graphs", "IMPL", "PrivateUse1")
_counter = itertools.count()


class Unsupported(Exception):
    """The graph has an op without a lowering (the caller runs it eagerly instead)."""


def _metas(value) -> list:
    if isinstance(value, (list, tuple)):
        return [m for v in value for m in _metas(v)]
    return [value]


def _struct(m):
    if not isinstance(m, torch.Tensor):
        return None
    return jax.ShapeDtypeStruct(tuple(m.shape), dtypes.to_jax(m.dtype))


class _NodePlan:
    """What the interpreter needs for one call_function node, fixed at compile time."""

    __slots__ = ("node", "spec", "compute", "structs", "out_metas", "index")

    def __init__(self, node: torch.fx.Node, index: int):
        self.node = node
        self.index = index
        self.spec = opspec.spec(node.target)
        if self.spec.lowering is None:
            raise Unsupported(str(node.target))
        self.out_metas = _metas(node.meta.get("val"))
        arg_metas = opspec.normalize(self.spec, *_args_meta(node))
        first = next((m for m in self.out_metas if isinstance(m, torch.Tensor)), None)
        self.compute = apply.promotion(self.spec, arg_metas, first.dtype if first is not None
                                       else None)
        self.structs = [_struct(m) for m in self.out_metas]


def _args_meta(node: torch.fx.Node) -> tuple[tuple, dict]:
    def meta(a):
        if isinstance(a, torch.fx.Node):
            return a.meta.get("val")
        if isinstance(a, (list, tuple)):
            return [meta(x) for x in a]
        return a

    return tuple(meta(a) for a in node.args), {k: meta(v) for k, v in node.kwargs.items()}


def _interpreter(gm: torch.fx.GraphModule, placeholders: list, outputs: list,
                 mutations: dict[int, torch.fx.Node]) -> tuple[Callable, bool]:
    """A JAX function of the graph's inputs computing (mutated inputs..., outputs...)."""
    plans: dict[torch.fx.Node, _NodePlan] = {}
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "call_function" and node.target is not operator.getitem:
            plans[node] = _NodePlan(node, i)
    random = any(p.spec.lowering.random for p in plans.values())

    def run(*inputs, key=None):
        env: dict[torch.fx.Node, Any] = dict(zip(placeholders, inputs))

        def value(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return [value(x) for x in a]
            return a

        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
                continue
            plan = plans[node]
            args = tuple(value(a) for a in node.args)
            kwargs = {k: value(v) for k, v in node.kwargs.items()}
            values = opspec.normalize(plan.spec, args, kwargs)
            rng = jax.random.fold_in(key, plan.index) if plan.spec.lowering.random else None
            results = apply.invoke(plan.spec, values, plan.compute, plan.structs, rng)
            results = [r if s is None or r is None else apply.broadcast_cast(r, s.shape, s.dtype)
                       for r, s in zip(results, plan.structs)]
            multi = isinstance(node.meta.get("val"), (list, tuple))
            env[node] = results if multi else results[0]
        new_inputs = [env[mutations[i]] for i in sorted(mutations)]
        return (*new_inputs, [env[o] for o in outputs])

    return run, random


def _schema_type(example) -> str:
    return "Tensor" if isinstance(example, torch.Tensor) else "Scalar"


class CompiledGraph:
    """Calls the graph's operator with the graph's inputs; outputs that are inputs pass
    through untouched."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
        results = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) \
            else [out_node.args[0]]
        # copy_ into a placeholder at the end of a graph mutates that input.
        mutations: dict[int, torch.fx.Node] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                    and node.args[0] in placeholders:
                mutations[placeholders.index(node.args[0])] = node.args[1]
        # Each output: computed by the program, an input passed through, or None.
        self.sources = []
        computed = []
        for r in results:
            if r is None:
                self.sources.append(("none",))
            elif r in placeholders:
                self.sources.append(("input", placeholders.index(r)))
            elif isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor):
                self.sources.append(("computed",))
                computed.append(r)
            else:
                raise Unsupported(f"graph output {r!r} that is not a tensor")
        fn, random = _interpreter(gm, placeholders, computed, mutations)

        name = f"graph_{next(_counter)}"
        args = ", ".join(
            f"{_schema_type(ex)}{'(a%d!)' % i if i in mutations else ''} x{i}"
            for i, ex in enumerate(example_inputs))
        _lib.define(f"{name}({args}) -> Tensor[]")
        out_metas = [r.meta["val"] for r in computed]

        def fake(*inputs):
            device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "meta")
            return [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device)
                    for m in out_metas]

        torch.library.register_fake(f"pjrt_graphs::{name}", fake, lib=_lib)
        self.op = getattr(torch.ops.pjrt_graphs, name).default
        registry.lower(self.op, random=random, eager=False)(fn)
        from ..eager import dispatch

        _impl.impl(name, dispatch.executor_kernel(self.op))
        self.n_inputs = len(placeholders)
        self._boxed_call = True  # AOTAutograd: __call__ takes the boxed list (kept by wraps)

    def __call__(self, args: list):
        """AOTAutograd's boxed calling convention: one list of inputs, which we clear."""
        args = list(args)
        outs = iter(self.op(*args))
        result = [next(outs) if s[0] == "computed" else args[s[1]] if s[0] == "input" else None
                  for s in self.sources]
        return result
