"""A compiled FX graph as one op: the whole graph is a lowering in the same table.

Each graph AOTAutograd hands us becomes a `pjrt_graphs::graph_<n>` operator
whose lowering interprets the FX graph node by node with the ops' own lowerings
(the same ones eager uses). Calling the operator goes through the eager
executor, so a compiled graph gets what every op gets: device buffers in and
out with PyTorch's strides, views of inputs read in place, mutated inputs
written back with donation, an in-memory and on-disk program cache, and, in
fused mode, fusion with the eager ops around it.

With dynamic sizes, a graph that `buckets.analyze` can prove safe runs at
bucket sizes (one program per bucket, see buckets.py); others are specialized
per shape.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

from .. import counters
from ..eager import opspec, recompiles
from ..lowering import apply, checks, registry
from ..runtime import DEVICE_TYPE as _PJRT
from ..runtime import watch
from ..storage import dtypes, views
from . import auto_functionalized, buckets

_lib = torch.library.Library("pjrt_graphs", "DEF")
_defined: dict[str, Any] = {}  # fingerprint -> the operator defined for it


def fingerprint(gm: torch.fx.GraphModule, *settings) -> str:
    """A digest of everything a graph's program depends on: its nodes with their shapes,
    strides and dtypes, its constants, and the settings that shape its lowering. It names
    the graph's operator, and so keys the program in the persistent cache: the n-th graph
    of two different programs must not share a compiled program."""
    h = hashlib.sha256()
    text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):  # source locations: not part of the program
            h.update(line.encode())
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor):
                h.update(_bytes(value).tobytes())
    h.update(repr(settings).encode())
    return h.hexdigest()[:24]


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A real tensor's bytes (bfloat16 has no numpy dtype), read outside the fake tensor
    mode AOTAutograd compiles under."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


class Unsupported(Exception):
    """The graph has an op without a lowering (the caller runs it eagerly instead)."""


# Builders of graphs that are not one single-device op, registered by upper layers:
# distributed/compiled.py runs a graph with collectives as one SPMD program of its
# process group. Each is called with (gm, interpreter fn, placeholders, computed outputs,
# mutations, random, symbolic) and returns a runner (inputs -> computed outputs, mutated
# inputs written) or None; it may raise Unsupported.
program_hooks: list[Callable] = []


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
        else:
            add(meta, value)
    sizes = dict(out)
    for meta, value in zip(placeholder_metas, inputs):
        if isinstance(meta, torch.Tensor):
            for s, n in zip(meta.stride(), _strides(value)):
                add(s, n)
    out.update(sizes)  # a size wins over a stride (a padded input's strides are not its own)
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
_NUMBERS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _is_host_number(node: torch.fx.Node) -> bool:
    """A call of a plain Python function (torch.sym_max, math.floor, operator.*) that
    computes a number from sizes and numbers: evaluated on the host while the program is
    traced, as Python would (its inputs are known then), never a lowering."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                                torch._ops.HigherOrderOperator)):
        return False
    return isinstance(node.meta.get("val"), _NUMBERS) and not any(
        isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)


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
                 mutations: dict[int, torch.fx.Node],
                 plan: buckets.Plan | None = None) -> tuple[Callable, bool, bool]:
    """(fn, random, products): a JAX function of the graph's inputs computing (mutated
    inputs..., outputs...), with a bucketing plan at bucket sizes, masking where the plan
    says; whether it takes an RNG key; whether it computes matrix products."""
    plans: dict[torch.fx.Node, _NodePlan | auto_functionalized.Plan] = {}
    for i, node in enumerate(gm.graph.nodes):
        if auto_functionalized.is_node(node):  # a custom op that mutates its inputs
            try:
                plans[node] = auto_functionalized.Plan(node, i)
            except NotImplementedError as e:
                raise Unsupported(str(e)) from None
        elif node.op == "call_function" and node.target is not operator.getitem \
                and not _is_size_node(node):
            if not isinstance(node.target, torch._ops.OpOverload):
                raise Unsupported(f"a call of {getattr(node.target, '__name__', node.target)}"
                                  " on tensors")
            plans[node] = _NodePlan(node, i)
    host = {n for n in gm.graph.nodes if _is_host_number(n)}
    constants = {n: _constant(gm, n) for n in gm.graph.find_nodes(op="get_attr")}
    random = any(p.spec.lowering.random for p in plans.values())
    products = any(p.spec.lowering.products for p in plans.values())
    placeholder_metas = [p.meta.get("val") for p in placeholders]

    def run(*inputs, key=None, truth=None):
        env: dict[torch.fx.Node, Any] = dict(zip(placeholders, inputs))
        bindings = bind(placeholder_metas, inputs)
        if truth is not None:  # symbols that are not bucketed have one value
            truth.buckets = {**bindings, **truth.buckets}
            truth.trues = {**bindings, **truth.trues}

        def value(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return [value(x) for x in a]
            if isinstance(a, torch.SymInt):
                return concrete((a,), bindings)[0]
            return a

        for node in gm.graph.nodes:
            if node.op == "get_attr":  # a tensor the graph holds (torch.tensor([1, 2]))
                env[node] = constants[node]
                continue
            if node.op != "call_function":
                continue
            target = node.target
            if target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
                continue
            if target in _SIZE_OPS or node in host:
                env[node] = target(*(value(a) for a in node.args),
                                   **{k: value(v) for k, v in node.kwargs.items()})
                continue
            if target in _SIZE_QUERIES:
                env[node] = _SIZE_QUERIES[target](*(value(a) for a in node.args))
                continue
            plan = plans[node]
            if type(plan) is auto_functionalized.Plan:
                rng = jax.random.fold_in(key, plan.index) if plan.spec.lowering.random else None
                env[node] = plan.run(value, rng)
                continue
            args = tuple(value(a) for a in node.args)
            kwargs = {k: value(v) for k, v in node.kwargs.items()}
            values = opspec.normalize(plan.spec, args, kwargs)
            rule = bucket_plan.rules.get(node) if bucket_plan is not None else None
            if rule is not None:
                values = _masked(node, values, rule, bucket_plan, truth)
            structs = plan.structs
            if structs is None:
                structs = [_struct(m, bindings) for m in plan.out_metas]
            rng = jax.random.fold_in(key, plan.index) if plan.spec.lowering.random else None
            contiguous = None
            if plan.spec.lowering.wants_layout:  # the traced tensors' layouts
                contiguous = tuple(a.meta["val"].is_contiguous() for a in node.args
                                   if isinstance(a, torch.fx.Node)
                                   and isinstance(a.meta.get("val"), torch.Tensor)) or None
            with checks.op_scope(str(plan.spec.op)):  # device-side errors name the node
                arrays = iter(apply.invoke(plan.spec, values, plan.compute, structs, rng,
                                           contiguous))
            results = []
            for m, st in zip(plan.out_metas, structs):
                if isinstance(m, (int, float, torch.SymInt, torch.SymFloat)):
                    # a number the meta kernel computes (SDPA's max_q): not from the lowering
                    results.append(concrete((m,), bindings)[0] if isinstance(m, torch.SymInt)
                                   else m)
                    continue
                r = next(arrays)
                if st is not None and r is not None:
                    r = apply.broadcast_cast(r, st.shape, st.dtype)
                    if m.dtype is torch.complex32:  # rounded as eager stores it
                        r = views.round_to_complex32(r)
                results.append(r)
            if rule is not None and rule.post is not None:
                results = _post(results, rule, truth)
            multi = isinstance(node.meta.get("val"), (list, tuple))
            env[node] = results if multi else results[0]
        new_inputs = [env[mutations[i]] for i in sorted(mutations)]
        if bucket_plan is not None:
            return (*new_inputs, [_flat_output(o, env[o], bucket_plan, truth) for o in outputs])
        return (*new_inputs, [env[o] for o in outputs])

    bucket_plan = plan
    return run, random, products


def _constant(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """A get_attr node's tensor as an array of the program (a constant in it)."""
    value = getattr(gm, node.target, None)
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        raise Unsupported(f"a graph attribute {node.target} that is not a dense tensor")
    raw = _bytes(value)
    return jnp.asarray(np.frombuffer(raw.tobytes(), dtype=dtypes.to_jax(value.dtype))
                       .reshape(tuple(value.shape)))


# ------------------------------------------------------------- bucketed sizes
def _masked(node: torch.fx.Node, values: list, rule: buckets.NodeRule, plan: buckets.Plan,
            truth: buckets.Truth) -> list:
    """The op's arguments with padded positions filled where its rule says."""
    values = list(values)
    for i, fill in rule.fills.items():
        x = values[i]
        if x is None or not hasattr(x, "dtype"):
            continue
        layout = plan.layouts.get(node.args[i])
        if layout is not None:
            values[i] = buckets.mask(x, layout, plan.sizes, truth,
                                     buckets.fill_value(fill, x.dtype, values))
    return values


def _post(results: list, rule: buckets.NodeRule, truth: buckets.Truth) -> list:
    arrays = [r for r in results if hasattr(r, "dtype")]
    fixed = iter(rule.post(arrays, truth))
    return [next(fixed) if hasattr(r, "dtype") else r for r in results]


_VIEW, _GATHER = 1, 2  # how a padded input reaches the program
_warned: set[str] = set()


def _is_size_node(node: torch.fx.Node) -> bool:
    return node.target in _SIZE_OPS or node.target in _SIZE_QUERIES or _is_host_number(node)


def _shape_symbols(metas: list) -> list:
    """The symbols of the inputs' sizes (what bucketing pads), if each can be bound."""
    found, bound = set(), set()
    for m in metas:
        sizes = m.shape if isinstance(m, torch.Tensor) else [m]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                expr = size.node.expr
                (bound if expr.is_Symbol else set()).add(expr)
                if isinstance(m, torch.Tensor):
                    found |= expr.free_symbols
    return sorted(found, key=str) if found <= bound else []


def _bucketing(gm: torch.fx.GraphModule, placeholders: list, metas: list,
               mutations: dict) -> buckets.Plan | None:
    """The graph's bucketing plan, or None: sizes are static, bucketing is off, or an op
    is not classified (then said once, counted, and the graph compiles per shape)."""
    steps = buckets.steps_per_octave()
    symbols = _shape_symbols(metas)
    if not steps or not symbols:
        return None
    if any(auto_functionalized.is_node(n) for n in gm.graph.nodes):
        return None  # not classified for buckets (and run eagerly at symbolic sizes)
    try:
        plan = buckets.analyze(gm, placeholders, symbols, skip=_is_size_node)
        for i in mutations:
            if plan.padded(plan.layouts[placeholders[i]]):
                raise buckets.Unclassified("an in-place update of an input with a dynamic size")
    except buckets.Unclassified as e:
        counters.count("bucket_fallback_graphs")
        if str(e) not in _warned:
            _warned.add(str(e))
            warnings.warn(f"pjrt: a torch.compile graph with dynamic sizes uses {e}, which "
                          "padding to buckets does not handle; that graph compiles once per "
                          "shape instead", stacklevel=4)
        return None
    plan.steps = steps
    plan.placeholders = placeholders
    plan.padded_inputs = [i for i, p in enumerate(placeholders)
                          if isinstance(metas[i], torch.Tensor) and plan.padded(plan.layouts[p])]
    return plan


def _unpack(plan: buckets.Plan, ints: list, scalars: list):
    """(Truth, {input: mode}, gather parameters) from the tails of the op's lists."""
    k = len(plan.symbols)
    truth = buckets.Truth(dict(zip(plan.symbols, ints[:k])), dict(zip(plan.symbols, scalars[:k])))
    return truth, dict(zip(plan.padded_inputs, ints[k:])), iter(scalars[k:])


def _gather_input(plan: buckets.Plan, placeholder: torch.fx.Node, flat, truth: buckets.Truth,
                  extra):
    m = placeholder.meta["val"]
    shape = concrete(m.shape, truth.buckets)
    offset = next(extra)
    strides = [next(extra) for _ in shape]
    return buckets.gather(flat, plan.layouts[placeholder], plan.sizes, truth, shape, offset,
                          strides)


# Storages of bucketed graphs' outputs (data pointer -> bytes): their size is set by the
# bucket, so the next graph can read them in place with one program per bucket.
_bucket_storages: dict[int, int] = {}


_BUCKET_STORAGES_KEPT = 100_000


def _remember(t: torch.Tensor) -> None:
    """Note an output storage (most recent last; the oldest are forgotten past the cap,
    which costs them a copy if a later graph reads them)."""
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    _bucket_storages.pop(ptr, None)
    _bucket_storages[ptr] = storage.nbytes()
    if len(_bucket_storages) > _BUCKET_STORAGES_KEPT:
        del _bucket_storages[next(iter(_bucket_storages))]


def _pad_input(x: torch.Tensor, m: torch.Tensor, layout, plan: buckets.Plan, padded: dict,
               extra: list) -> tuple[torch.Tensor, int]:
    """`x` as the program reads it at the bucket size: read from its own storage when
    that is bucket-sized (an output of a bucketed graph), else copied into one."""
    shape = concrete(m.shape, padded)
    numel = math.prod(shape)
    contig = views.contiguous_strides(shape)
    storage = x.untyped_storage()
    size = storage.nbytes() // x.element_size()
    same_index = buckets.identity(layout, plan.sizes)
    if size == numel or _bucket_storages.get(storage.data_ptr()) == storage.nbytes():
        if same_index and x.storage_offset() == 0 and tuple(x.stride()) == contig \
                and size >= numel:
            return x.as_strided(shape, contig, 0), _VIEW
        extra.extend([x.storage_offset(), *x.stride()])
        return x.as_strided((size,), (1,), 0), _GATHER
    counters.count("bucket_input_copies")  # a small copy program per true shape
    fresh = torch.empty((numel,), dtype=x.dtype, device=x.device)
    if same_index:
        fresh.as_strided(tuple(x.shape), contig, 0).copy_(x)
        return fresh.as_strided(shape, contig, 0), _VIEW
    dense = views.contiguous_strides(tuple(x.shape))
    fresh.as_strided(tuple(x.shape), dense, 0).copy_(x)
    extra.extend([0, *dense])
    return fresh, _GATHER


def _capacity(m: torch.Tensor, bindings: dict) -> int:
    """Elements of the flat buffer holding `m` at bucket sizes (and so at any true size
    of that bucket)."""
    shape, stride = concrete(m.shape, bindings), concrete(m.stride(), bindings)
    return max(math.prod(shape), views.span(shape, stride))


def _flat_output(node: torch.fx.Node, y, plan: buckets.Plan, truth: buckets.Truth):
    """A result at the bucket shape as a flat buffer holding it in its true layout
    (PyTorch's strides at the true sizes), which the caller views at the true shape."""
    m = node.meta["val"]
    layout = plan.layouts[node]
    cap = _capacity(m, truth.buckets)
    strides = [buckets._expr(s) for s in m.stride()]
    if buckets.identity(layout, plan.sizes) and not any(plan.sizes.padded(s) for s in strides):
        shape, stride = concrete(m.shape, truth.buckets), concrete(m.stride(), truth.buckets)
        return views.write(jnp.zeros((cap,), y.dtype), y, shape, stride, 0)
    true_strides = [truth.true(s) for s in strides]
    return buckets.scatter(y, layout, plan.sizes, truth, true_strides, cap)


def _signature(args) -> tuple:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int: lambda x, d: x.shape[d],
    torch.ops.aten.sym_numel.default: lambda x: x.size,
    torch.ops.aten.sym_stride.int: lambda x, d: int(math.prod(x.shape[d + 1:])),
}


# View ops that a saved activation may apply to a graph input: such an output is made on
# the host as a view of the input (as PyTorch would), not copied out by the program.
_aten = torch.ops.aten
_HOST_VIEWS = {_aten.t.default, _aten.transpose.int, _aten.permute.default,
               _aten.view.default, _aten.unsqueeze.default, _aten.squeeze.dim,
               _aten.expand.default, _aten.slice.Tensor, _aten.select.int,
               _aten.alias.default, _aten.detach.default}


def _input_view(node, placeholders: list, mutations: dict) -> tuple | None:
    """(input index, [(view op, arguments), ...]) when `node` is only views of an input
    that the graph does not mutate (a transposed weight saved for the backward)."""
    steps = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and node.target in _HOST_VIEWS:
        rest = node.args[1:]
        if node.kwargs or any(isinstance(a, (torch.fx.Node, torch.SymInt)) or
                              (isinstance(a, (list, tuple)) and
                               any(isinstance(x, (torch.fx.Node, torch.SymInt)) for x in a))
                              for a in rest):
            return None
        steps.append((node.target, rest))
        node = node.args[0]
    if not steps or node not in placeholders or placeholders.index(node) in mutations:
        return None
    return placeholders.index(node), steps[::-1]


def _check_strided_inputs(gm: torch.fx.GraphModule, placeholders: list) -> None:
    """as_strided's lowering addresses its input's values as a dense buffer: true of what
    the graph computes, not of an input that is a view (its storage has other elements,
    which as_strided may read) nor of a view of an input. Such graphs run op by op."""
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.as_strided.default):
        src = node.args[0]
        if src not in placeholders:
            while isinstance(src, torch.fx.Node) and src.op == "call_function" \
                    and _is_view(src.target):
                src = src.args[0]
            if src in placeholders:
                raise Unsupported("as_strided over a view of a graph input")
            continue
        m = src.meta.get("val")
        if not isinstance(m, torch.Tensor) or _is_symbolic(m):
            raise Unsupported("as_strided over a graph input of unknown layout")
        if m.storage_offset() != 0 or not m.is_contiguous() \
                or m.untyped_storage().nbytes() != m.numel() * m.element_size():
            raise Unsupported("as_strided over a graph input that is part of its storage")


def _is_view(target) -> bool:
    """An ATen view op: its result aliases its first argument, which it does not write."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None and \
        not returns[0].alias_info.is_write


def _is_list_view_item(node: torch.fx.Node) -> bool:
    """One of the views a list-returning view op (split, unbind, chunk) made."""
    base = node.args[0] if node.target is operator.getitem and node.args else None
    return isinstance(base, torch.fx.Node) and base.op == "call_function" and \
        _is_view(base.target)


def _static(args) -> bool:
    """No graph value among `args` (nested lists included): known when the graph is built."""
    return not any(isinstance(a, (torch.fx.Node, torch.SymInt)) or
                   (isinstance(a, (list, tuple)) and not _static(a)) for a in args)


def _output_view(node, bases: dict) -> tuple | None:
    """(output index, [(view op, arguments), ...]) when `node` is only views of another
    output of the graph (`bases`: output node -> its index): as in eager, it is returned
    as a view of that output, sharing its storage, made on the host."""
    steps = []
    while node not in bases and isinstance(node, torch.fx.Node) and \
            node.op == "call_function":
        if _is_list_view_item(node):
            steps.append((operator.getitem, node.args[1:]))  # one of split's views
        elif not _is_view(node.target):
            break
        elif node.kwargs or not _static(node.args[1:]):
            return None
        else:
            steps.append((node.target, node.args[1:]))
        node = node.args[0]
    if not steps or node not in bases:
        return None
    return bases[node], steps[::-1]


def _apply_views(t: torch.Tensor, steps: list) -> torch.Tensor:
    for op, rest in steps:
        t = op(t, *rest)
    return t


def _normalize(gm: torch.fx.GraphModule) -> None:
    """Ops that reach compiled graphs only, rewritten in place to the ATen ops with a
    lowering that mean the same: the copy of a tensor constant (torch.tensor([1, 2]) in
    the traced code), and the prims cast that decompositions of Python float math on
    sizes (math.sqrt(x.shape[-1])) leave."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is _aten.lift_fresh_copy.default:
            node.target = _aten.clone.default
            changed = True
        elif node.target is torch.ops.prims.convert_element_type.default:
            x, dtype = node.args
            node.target, node.args, node.kwargs = _aten._to_copy.default, (x,), {"dtype": dtype}
            changed = True
    if changed:
        gm.recompile()


def _describe(name: str, gm: torch.fx.GraphModule, lines: dict) -> None:
    """What the graph's programs hold, for profiles, dumps and the report: each node with
    its target and the user's line Dynamo traced it from (a backward node: its forward's)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        source = node.meta.get("source_fn_stack") or node.meta.get("fwd_source_fn_stack")
        ops.append((node.name, str(node.target), lines.get(source[-1][0]) if source else None))
    watch.describe_op(f"pjrt_graphs.{name}.default", "compiled",
                      f"torch.compile graph {name} ({len(ops)} ops)", ops)


def pjrt_device(gm: torch.fx.GraphModule, example_inputs: list) -> torch.device | None:
    """The pjrt device a graph computes on: its first pjrt input's, else the first pjrt
    tensor it computes (Dynamo's and AOTAutograd's node values); None if it has none."""
    def pjrt(x) -> bool:
        return isinstance(x, torch.Tensor) and x.device.type == _PJRT

    values = (node.meta.get("val", node.meta.get("example_value")) for node in gm.graph.nodes)
    tensors = (x for v in values for x in torch.utils._pytree.tree_leaves(v))
    found = next((x for x in itertools.chain(example_inputs, tensors) if pjrt(x)), None)
    return None if found is None else torch.device(_PJRT, found.device.index or 0)


def _cpu_tensors(example_inputs: list, mutations: dict, out_metas: list,
                 gm: torch.fx.GraphModule) -> tuple[list[int], set[int], torch.device]:
    """A graph that mixes CPU and pjrt tensors (`x_cpu.to("pjrt")`, `y.cpu()` inside a
    compiled function) runs as one program on the graph's device: (the inputs to move
    there per call: CPU tensors, except 0-dim ones that ride along as scalars where a pjrt
    tensor is passed too; the computed outputs, by position, that PyTorch gives on the
    CPU and that go back there; the device)."""
    device = pjrt_device(gm, example_inputs)
    if device is None:
        from ..runtime import device_module

        device = torch.device(_PJRT, device_module.current_device())
    passed_pjrt = any(isinstance(x, torch.Tensor) and x.device.type == _PJRT
                      for x in example_inputs)
    moved = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)
             and x.device.type == "cpu" and i not in mutations
             and (x.dim() > 0 or not passed_pjrt)]
    back = {k for k, m in enumerate(out_metas) if m.device.type == "cpu"}
    return moved, back, device


class CompiledGraph:
    """Calls the graph's operator with the graph's inputs; outputs that are inputs pass
    through untouched."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list,
                 internal_from: int | None = None, name: str | None = None,
                 lines: dict | None = None):
        """`internal_from`: outputs from this index on are read only by our own graphs
        (a forward's saved activations); they keep their dimension order but lose the gaps
        of the views they were traced as (q, k and v are views of one qkv buffer), so the
        program writes each one plainly instead of padding it out to the whole buffer.
        `name`: the operator's name when this graph was compiled before (a warm start
        rebuilds it from a stored copy, whose printout may differ in symbol names).
        `lines`: the user's line of each node of Dynamo's graph, by name (for profiles and
        dumps; a graph from the AOTAutograd cache has none)."""
        _normalize(gm)
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
        _check_strided_inputs(gm, placeholders)
        if any(isinstance(example_inputs[i], torch.Tensor) and example_inputs[i].device.type
               == "cpu" for i in mutations):  # the executor writes device storages only
            raise Unsupported("an in-place update of a CPU tensor (an optimizer's step count)")
        # Each output: computed by the program, an input passed through, a view of another
        # output, or None.
        self.sources = []
        computed = []
        dense: list[bool] = []  # per computed output: contiguous instead of its meta strides
        user = len(results) if internal_from is None else internal_from
        bases: dict[torch.fx.Node, int] = {}
        for i, r in enumerate(results[:user]):
            if isinstance(r, torch.fx.Node) and r not in placeholders \
                    and not _is_view(r.target) and not _is_list_view_item(r):
                bases.setdefault(r, i)
        for i, r in enumerate(results):
            if r is None:
                self.sources.append(("none",))
            elif i < user and bases.get(r, i) < i:  # returned twice: the same tensor twice
                self.sources.append(("alias", bases[r], []))
            elif r in placeholders:
                self.sources.append(("input", placeholders.index(r)))
            elif internal_from is not None and i >= internal_from and \
                    (view := _input_view(r, placeholders, mutations)) is not None:
                self.sources.append(("view", *view))
            elif i < user and (alias := _output_view(r, bases)) is not None:
                self.sources.append(("alias", *alias))
                bases.setdefault(r, i)  # a later view of it starts from this tensor
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
        placeholder_metas = [p.meta.get("val") for p in placeholders]
        self.bucketing = _bucketing(gm, placeholders, placeholder_metas, mutations)
        fn, random, products = _interpreter(gm, placeholders, computed, mutations,
                                            self.bucketing)
        self.runner = None
        for hook in program_hooks:
            self.runner = self.runner or hook(
                gm, fn, placeholders, computed, mutations, random,
                any(_is_symbolic(p.meta.get("val")) for p in placeholders))

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

        n_ints, n_scalars = len(groups["ints"]), len(groups["scalars"])
        bucketing = self.bucketing

        def lowering(mutated, tensors, ints, scalars, *, key=None):
            if bucketing is None:
                return fn(*regroup(mutated, tensors, ints, scalars), key=key)
            truth, modes, extra = _unpack(bucketing, ints[n_ints:], scalars[n_scalars:])
            inputs = regroup(mutated, tensors, ints[:n_ints], scalars[:n_scalars])
            for i, mode in modes.items():
                if mode == _GATHER:
                    inputs[i] = _gather_input(bucketing, placeholders[i], inputs[i], truth,
                                              extra)
            return fn(*inputs, key=key, truth=truth)

        lowering.__name__ = "compiled_graph"
        out_metas = [r.meta["val"] for r in computed]
        if name is None:
            name = "graph_" + fingerprint(gm, internal_from,
                                          None if bucketing is None else bucketing.steps)
        self.name = name
        if self.runner is not None:
            self.runner.name = name
        self.n_inputs = len(placeholders)
        self.placeholder_metas = placeholder_metas
        self.out_metas = out_metas
        self._moved, self._cpu_outputs, self._device = _cpu_tensors(
            example_inputs, mutations, out_metas, gm)
        self.symbolic = any(_is_symbolic(m) for m in placeholder_metas)
        self._boxed_call = True  # AOTAutograd: __call__ takes the boxed list (kept by wraps)
        _describe(name, gm, lines or {})
        if name in _defined:  # the same graph again (a reset, another model instance)
            self.op = _defined[name]
            return
        _lib.define(f"{name}(Tensor(a!)[] mutated, Tensor[] tensors, SymInt[] ints, "
                    "Scalar[] scalars) -> Tensor[]")

        def fake(mutated, tensors, ints, scalars):
            inputs = regroup(mutated, tensors, ints[:n_ints], scalars[:n_scalars])
            device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "meta")
            if bucketing is not None:
                b = dict(zip(bucketing.symbols, ints[n_ints:]))
                return [torch.empty((_capacity(m, b),), dtype=m.dtype, device=device)
                        for m in out_metas]
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
        registry.lower(self.op, random=random, eager=False, products=products)(lowering)
        from ..eager import dispatch

        dispatch.register_kernel(self.op)
        _defined[name] = self.op

    def __call__(self, args: list):
        """AOTAutograd's boxed calling convention: one list of inputs, which we clear."""
        args = list(args)
        run = self._on_device(args)
        sizes = bind(self.placeholder_metas, args) if self.symbolic else {}
        if self.bucketing is not None:
            return self._call_bucketed(args, run, sizes)
        if self.symbolic:
            recompiles.note(self.op, _signature(run), f"compiled graph {self.op}",
                            "compiled")
        if self.runner is not None:
            return self._results(args, iter(self.runner(run)), sizes)
        g = self.groups
        outs = iter(self.op([run[i] for i in g["mutated"]], [run[i] for i in g["tensors"]],
                            [run[i] for i in g["ints"]], [run[i] for i in g["scalars"]]))
        return self._results(args, outs, sizes)

    def _on_device(self, args: list) -> list:
        """The inputs the program takes: CPU tensors moved to the graph's device."""
        if not self._moved:
            return args
        run = list(args)
        for i in self._moved:
            run[i] = args[i].to(self._device)
        return run

    def _back_to_cpu(self, outs):
        """The computed outputs, those PyTorch gives on the CPU moved back there."""
        for k, out in enumerate(outs):
            yield out.cpu() if k in self._cpu_outputs else out

    def _results(self, args: list, outs, sizes: dict) -> list:
        if self._cpu_outputs:
            outs = self._back_to_cpu(outs)
        results = [next(outs) if s[0] == "computed" else args[s[1]] if s[0] == "input"
                   else concrete((s[1],), sizes)[0] if s[0] == "size"
                   else _apply_views(args[s[1]], s[2]) if s[0] == "view" else None
                   for s in self.sources]
        for i, s in enumerate(self.sources):
            if s[0] == "alias":
                results[i] = _apply_views(results[s[1]], s[2])
        return results

    def _call_bucketed(self, args: list, run: list, sizes: dict) -> list:
        """Inputs padded to the bucket, true sizes passed at run time, outputs viewed back
        at their true sizes (and strides)."""
        plan = self.bucketing
        steps = plan.steps
        padded = {s: buckets.bucket(v, steps) if s in plan.sizes.symbols else v
                  for s, v in sizes.items()}
        g = self.groups
        passed = list(run)
        modes, extra = [], []
        for i in g["ints"]:
            m = self.placeholder_metas[i]
            passed[i] = concrete((m,), padded)[0] if isinstance(m, torch.SymInt) else args[i]
        for i in g["tensors"]:
            layout = plan.layouts[plan.placeholders[i]]
            if plan.padded(layout):
                passed[i], mode = _pad_input(run[i], self.placeholder_metas[i], layout, plan,
                                             padded, extra)
                modes.append(mode)
        ints = [passed[i] for i in g["ints"]] + [padded[s] for s in plan.symbols] + modes
        scalars = [args[i] for i in g["scalars"]] + [sizes[s] for s in plan.symbols] + extra
        recompiles.note(self.op, _signature([passed[i] for i in g["tensors"]] + ints),
                        f"compiled graph {self.op} (sizes padded to buckets)", "compiled",
                        unit="argument",
                        advice="Each new bucket compiles a new program: fewer buckets "
                        "(TORCH_PJRT_BUCKETS=1 or 2) compile less.")
        misses = counters.value("cache_misses")
        outs = self.op([args[i] for i in g["mutated"]], [passed[i] for i in g["tensors"]],
                       ints, scalars)
        if counters.value("cache_misses") != misses:
            counters.count("bucketed_graph_programs")
        for flat in outs:
            _remember(flat)
        views_ = (flat.as_strided(concrete(m.shape, sizes), concrete(m.stride(), sizes), 0)
                  for flat, m in zip(outs, self.out_metas))
        return self._results(args, views_, sizes)
