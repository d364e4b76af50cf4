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

from ..eager import opspec, recompiles
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


def _struct(m, bindings: dict):
    if not isinstance(m, torch.Tensor):
        return None
    return jax.ShapeDtypeStruct(concrete(m.shape, bindings), dtypes.to_jax(m.dtype))


# ------------------------------------------------------------ symbolic sizes
# With dynamic=True or mark_dynamic, sizes in the graph are symbols (s0, s1, ...).
# Each call binds them to the sizes of the actual inputs; the program is then
# specialized to those sizes (and cached per shape like any other program).
def bind(placeholder_metas: list, inputs) -> dict:
    """{sympy symbol: int} from the inputs' actual sizes and integer values."""
    out = {}

    def add(sym, value):
        if isinstance(sym, torch.SymInt) and sym.node.expr.is_Symbol:
            out[sym.node.expr] = int(value)

    for meta, value in zip(placeholder_metas, inputs):
        if isinstance(meta, torch.Tensor):
            for s, n in zip(meta.shape, value.shape):
                add(s, n)
            for s, n in zip(meta.stride(), _strides(value)):
                add(s, n)
        else:
            add(meta, value)
    return out


def _strides(value) -> tuple:
    if isinstance(value, torch.Tensor):
        return value.stride()
    return ()  # a JAX array inside the program: dense, strides are not symbols


def concrete(sizes, bindings: dict) -> tuple[int, ...]:
    return tuple(int(s) if not isinstance(s, torch.SymInt) else
                 int(s.node.expr.xreplace(bindings)) for s in sizes)


def compact_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides with the same order of dimensions in memory as `strides`, without gaps."""
    order = sorted(range(len(shape)), key=lambda d: (strides[d], shape[d]))
    out = [0] * len(shape)
    step = 1
    for d in order:
        out[d] = step
        step *= max(shape[d], 1)
    return tuple(out)


def _is_symbolic(m) -> bool:
    if isinstance(m, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*m.shape, *m.stride()))
    return isinstance(m, torch.SymInt)


# Python operators on sizes that appear in symbolic graphs, evaluated on ints.
_SIZE_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
             operator.truediv, operator.neg, operator.eq, operator.ne, operator.lt,
             operator.le, operator.gt, operator.ge, operator.pow}


class _NodePlan:
    """What the interpreter needs for one call_function node, fixed at compile time."""

    __slots__ = ("node", "spec", "compute", "structs", "out_metas", "index", "symbolic")

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
        self.symbolic = any(_is_symbolic(m) for m in self.out_metas)
        self.structs = None if self.symbolic else [_struct(m, {}) for m in self.out_metas]


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
        if node.op == "call_function" and node.target is not operator.getitem \
                and node.target not in _SIZE_OPS and node.target not in _SIZE_QUERIES:
            plans[node] = _NodePlan(node, i)
    random = any(p.spec.lowering.random for p in plans.values())
    placeholder_metas = [p.meta.get("val") for p in placeholders]

    def run(*inputs, key=None):
        env: dict[torch.fx.Node, Any] = dict(zip(placeholders, inputs))
        bindings = bind(placeholder_metas, inputs)

        def value(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return [value(x) for x in a]
            if isinstance(a, torch.SymInt):
                return concrete((a,), bindings)[0]
            return a

        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            if target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
                continue
            if target in _SIZE_OPS:
                env[node] = target(*(value(a) for a in node.args))
                continue
            if target in _SIZE_QUERIES:
                env[node] = _SIZE_QUERIES[target](*(value(a) for a in node.args))
                continue
            plan = plans[node]
            args = tuple(value(a) for a in node.args)
            kwargs = {k: value(v) for k, v in node.kwargs.items()}
            values = opspec.normalize(plan.spec, args, kwargs)
            structs = plan.structs
            if structs is None:
                structs = [_struct(m, bindings) for m in plan.out_metas]
            rng = jax.random.fold_in(key, plan.index) if plan.spec.lowering.random else None
            arrays = iter(apply.invoke(plan.spec, values, plan.compute, structs, rng))
            results = []
            for m, st in zip(plan.out_metas, structs):
                if isinstance(m, (int, float, torch.SymInt, torch.SymFloat)):
                    # a number the meta kernel computes (SDPA's max_q): not from the lowering
                    results.append(concrete((m,), bindings)[0] if isinstance(m, torch.SymInt)
                                   else m)
                    continue
                r = next(arrays)
                results.append(r if st is None or r is None
                               else apply.broadcast_cast(r, st.shape, st.dtype))
            multi = isinstance(node.meta.get("val"), (list, tuple))
            env[node] = results if multi else results[0]
        new_inputs = [env[mutations[i]] for i in sorted(mutations)]
        return (*new_inputs, [env[o] for o in outputs])

    return run, random


def _signature(args) -> tuple:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int: lambda x, d: x.shape[d],
    torch.ops.aten.sym_numel.default: lambda x: x.size,
    torch.ops.aten.sym_stride.int: lambda x, d: int(__import__("math").prod(x.shape[d + 1:])),
}


class CompiledGraph:
    """Calls the graph's operator with the graph's inputs; outputs that are inputs pass
    through untouched."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list,
                 internal_from: int | None = None):
        """`internal_from`: outputs from this index on are read only by our own graphs
        (a forward's saved activations); they keep their dimension order but lose the gaps
        of the views they were traced as (q, k and v are views of one qkv buffer), so the
        program writes each one plainly instead of padding it out to the whole buffer."""
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if not any(isinstance(ex, torch.Tensor) for ex in example_inputs):
            # the dispatcher finds a backend through tensor arguments: none, no operator
            raise Unsupported("a graph without tensor inputs")
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
        dense: list[bool] = []  # per computed output: contiguous instead of its meta strides
        for i, r in enumerate(results):
            if r is None:
                self.sources.append(("none",))
            elif r in placeholders:
                self.sources.append(("input", placeholders.index(r)))
            elif isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor):
                self.sources.append(("computed",))
                computed.append(r)
                dense.append(internal_from is not None and i >= internal_from)
            elif isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"),
                                                             (int, torch.SymInt)):
                # a size the backward needs (symbolic graphs): computed on the host per call
                self.sources.append(("size", r.meta["val"]))
            else:
                raise Unsupported(f"graph output {r!r} that is not a tensor")
        fn, random = _interpreter(gm, placeholders, computed, mutations)

        # The operator takes the inputs in four lists (schemas are limited to 64 arguments):
        # mutated tensors, other tensors, integers (static), other numbers (run time).
        groups: dict[str, list[int]] = {"mutated": [], "tensors": [], "ints": [], "scalars": []}
        for i, ex in enumerate(example_inputs):
            if isinstance(ex, torch.Tensor):
                groups["mutated" if i in mutations else "tensors"].append(i)
            elif isinstance(ex, (int, torch.SymInt)):
                groups["ints"].append(i)
            else:
                groups["scalars"].append(i)
        self.groups = groups
        n_inputs = len(example_inputs)

        def regroup(mutated, tensors, ints, scalars):
            placed = [None] * n_inputs
            for name_, values in (("mutated", mutated), ("tensors", tensors), ("ints", ints),
                                  ("scalars", scalars)):
                for i, v in zip(groups[name_], values):
                    placed[i] = v
            return placed

        def lowering(mutated, tensors, ints, scalars, *, key=None):
            return fn(*regroup(mutated, tensors, ints, scalars), key=key)

        lowering.__name__ = "compiled_graph"
        name = f"graph_{next(_counter)}"
        _lib.define(f"{name}(Tensor(a!)[] mutated, Tensor[] tensors, SymInt[] ints, "
                    "Scalar[] scalars) -> Tensor[]")
        out_metas = [r.meta["val"] for r in computed]
        placeholder_metas = [p.meta.get("val") for p in placeholders]

        def fake(mutated, tensors, ints, scalars):
            inputs = regroup(mutated, tensors, ints, scalars)
            device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "meta")
            b = bind(placeholder_metas, inputs)
            outs = []
            for m, d in zip(out_metas, dense):
                shape, strides = concrete(m.shape, b), concrete(m.stride(), b)
                if d:
                    strides = compact_strides(shape, strides)
                outs.append(torch.empty_strided(shape, strides, dtype=m.dtype, device=device))
            return outs

        torch.library.register_fake(f"pjrt_graphs::{name}", fake, lib=_lib)
        self.op = getattr(torch.ops.pjrt_graphs, name).default
        registry.lower(self.op, random=random, eager=False)(lowering)
        from ..eager import dispatch

        _impl.impl(name, dispatch.executor_kernel(self.op))
        self.n_inputs = len(placeholders)
        self.placeholder_metas = placeholder_metas
        self.symbolic = any(_is_symbolic(m) for m in placeholder_metas)
        self._boxed_call = True  # AOTAutograd: __call__ takes the boxed list (kept by wraps)

    def __call__(self, args: list):
        """AOTAutograd's boxed calling convention: one list of inputs, which we clear."""
        args = list(args)
        if self.symbolic:
            recompiles.note(self.op, _signature(args), f"compiled graph {self.op}")
        g = self.groups
        outs = iter(self.op([args[i] for i in g["mutated"]], [args[i] for i in g["tensors"]],
                            [args[i] for i in g["ints"]], [args[i] for i in g["scalars"]]))
        sizes = bind(self.placeholder_metas, args) if self.symbolic else {}
        return [next(outs) if s[0] == "computed" else args[s[1]] if s[0] == "input"
                else concrete((s[1],), sizes)[0] if s[0] == "size" else None
                for s in self.sources]
