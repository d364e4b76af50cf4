"""Dynamic sizes padded to buckets: one XLA program per bucket, not per size.

With `dynamic=True` or `torch._dynamo.mark_dynamic`, a graph's sizes are symbols
(s0, s1, ...). XLA programs have static shapes, so without bucketing every new
size compiles a new program. Instead each size symbol is rounded up to a bucket,
the program computes at the bucket size with the true sizes as run-time inputs,
and the outputs are cut back to the true sizes.

Bucket policy (TORCH_PJRT_BUCKETS=k, default 4; lowering/bucket_sizes.py): sizes up
to 16 round up to the next power of two, larger ones to k buckets per doubling (20, 24,
28, 32, 40, ... with k=4); TORCH_PJRT_BUCKETS=0 (or off) turns bucketing off: one program
per size, as without it.

Padding must never change a valid result. `analyze` proves that per graph, from
the nodes' symbolic shapes: it follows, for every dimension of every tensor,
how its index is made of size factors (a view of [3, s1, 32] as [3*s1, 32] has
the row factors (3, s1)), so the valid positions of every padded dimension are
known. Values at padded positions are garbage. Ops that keep positions apart
(elementwise, views, batch dims of matmuls, norms, embeddings) need nothing;
ops that reduce or mix along a padded dimension get their operands masked with
`jnp.where` first (zero for sums and contractions, -inf for max and softmax, the
ignore_index for nll_loss targets; mean is rescaled by the true count). An op
that is not classified makes the whole graph fall back to one program per size.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import sympy
import torch
import torch.fx
from jax import lax

# the policy, shared with fused eager's attention over a growing cache (compile/graph.py
# and compile/warm.py read it from here)
from ..lowering.bucket_sizes import SMALL, bucket, steps_per_octave  # noqa: F401

aten = torch.ops.aten

# ---------------------------------------------------------- sizes as factors
# A dimension's index is a mixed-radix number of factors, outermost first; each
# factor is a sympy expression (an Integer, or one with bucketed symbols). Its
# valid positions are those where every factor's digit is below its true size.
Dim = tuple  # tuple[sympy.Expr, ...]
Layout = tuple  # tuple[Dim, ...], one per tensor dimension


class Unclassified(Exception):
    """An op (or use) that bucketing cannot prove safe: the graph compiles per size."""


def _expr(size) -> sympy.Expr:
    if isinstance(size, torch.SymInt):
        return sympy.sympify(size.node.expr)
    return sympy.Integer(int(size))


def evaluate(expr: sympy.Expr, values: dict) -> Any:
    """`expr` with symbols from `values` (ints, or traced integers in a program)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return values[expr]
    if expr.is_Add or expr.is_Mul:
        parts = [evaluate(a, values) for a in expr.args]
        return math.prod(parts) if expr.is_Mul else sum(parts[1:], parts[0])
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        return evaluate(expr.base, values) ** int(expr.exp)
    raise Unclassified(f"the size expression {expr}")


class _Sizes:
    """Which symbols are bucketed, and a check that an expression can be evaluated."""

    def __init__(self, symbols: Sequence[sympy.Symbol]):
        self.symbols = frozenset(symbols)
        self._probe = {s: 2 for s in symbols}

    def padded(self, expr: sympy.Expr) -> bool:
        if not (expr.free_symbols & self.symbols):
            return False
        evaluate(expr, {**{s: 2 for s in expr.free_symbols}, **self._probe})
        return True

    def dim_padded(self, dim: Dim) -> bool:
        return any(self.padded(f) for f in dim)

    def layout_padded(self, layout) -> bool:
        return layout is not None and any(self.dim_padded(d) for d in layout)


def _norm(dim: Dim) -> Dim:
    """The dim's factors in a canonical form (for comparing): a factor c*s with c static
    is (s, c), the same valid prefix; adjacent static factors merged; ones dropped."""
    out: list = []
    for f in dim:
        coeff, rest = f.as_coeff_Mul()
        parts = [rest, coeff] if coeff.is_Integer and coeff > 1 and rest.free_symbols else [f]
        for g in parts:
            if g == 1:
                continue
            if out and g.is_Integer and out[-1].is_Integer:
                out[-1] = out[-1] * g
            else:
                out.append(g)
    return tuple(out)


def _plain(m: torch.Tensor) -> Layout:
    return tuple((_expr(s),) for s in m.shape)


def _is_poly(q: sympy.Expr) -> bool:
    """Is `q` a polynomial with positive integer coefficients (a whole number of elements)?"""
    q = sympy.expand(q)
    if not q.free_symbols:
        return bool(q.is_Integer and q >= 1)
    if not q.is_polynomial(*q.free_symbols):
        return False
    return all(c.is_Integer and c > 0 for c in sympy.Poly(q, *q.free_symbols).coeffs())


def regroup(layout: Layout, out_sizes: Sequence[sympy.Expr]) -> Layout:
    """The factors of a view's result: the input's factors, in order, grouped into the
    output dims (static factors may split; a padded one may not)."""
    factors = [f for dim in layout for f in _norm(dim)]
    out, i = [], 0
    for size in out_sizes:
        group, rem = [], size
        while rem != 1:
            if i >= len(factors):
                raise Unclassified("a view that changes the number of elements")
            f = factors[i]
            if f.is_Integer and rem.is_Integer and int(f) % int(rem) == 0 and f != rem:
                group.append(rem)
                factors[i] = sympy.Integer(int(f) // int(rem))
                rem = sympy.Integer(1)
                continue
            q = sympy.cancel(rem / f)
            c = sympy.cancel(f / rem)
            if not _is_poly(q) and c.is_Integer and c > 1:
                # a prefix of c*s positions (c static) is a prefix of s rows of c: f splits
                # into (rem, c), the padded part outermost
                factors[i:i + 1] = [rem, c]
                continue
            if not _is_poly(q):
                raise Unclassified("a view that splits a padded size")
            group.append(f)
            rem = q
            i += 1
        out.append(tuple(group) or (sympy.Integer(1),))
    if any(f != 1 for f in factors[i:]):
        raise Unclassified("a view that changes the number of elements")
    return tuple(out)


# ------------------------------------------------------------------ the plan
FILL_LOW, FILL_HIGH = "low", "high"  # the dtype's lowest / highest value


@dataclass
class NodeRule:
    """How one node runs at bucket sizes: operands to mask first, a result fix-up."""

    fills: dict[int, Any] = field(default_factory=dict)  # arg index -> fill value
    post: Callable | None = None  # (results, node layouts, truth) -> results


@dataclass
class Plan:
    """The bucketing of one graph: symbols, every value's layout, the per-node rules."""

    symbols: tuple  # bucketed sympy symbols, in order
    layouts: dict  # fx.Node -> Layout, or a list of them (multi-output), or None
    rules: dict  # fx.Node -> NodeRule
    sizes: _Sizes
    steps: int = 4  # buckets per octave
    placeholders: list = field(default_factory=list)
    padded_inputs: list = field(default_factory=list)  # placeholder indices, in order

    def padded(self, layout) -> bool:
        return self.sizes.layout_padded(layout)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def analyze(gm: torch.fx.GraphModule, placeholders: list, symbols: Sequence,
            skip: Callable[[torch.fx.Node], bool]) -> Plan:
    """Every value's layout and every node's masking rule, or Unclassified(op)."""
    sizes = _Sizes(symbols)
    plan = Plan(tuple(symbols), {}, {}, sizes)
    splits = _placeholder_splits(gm, placeholders, sizes)
    for p in placeholders:
        m = _val(p)
        plan.layouts[p] = splits.get(p) or (_plain(m) if isinstance(m, torch.Tensor) else None)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            src = plan.layouts.get(node.args[0])
            plan.layouts[node] = src[node.args[1]] if isinstance(src, list) else None
            continue
        if skip(node):  # size arithmetic: checked where the sizes are used
            plan.layouts[node] = None
            continue
        _check_scalars(node, sizes)
        layouts, rule = _classify(node, plan)
        plan.layouts[node] = layouts
        if rule is not None and (rule.fills or rule.post):
            plan.rules[node] = rule
    return plan


_SIZE_VALUES = {aten.arange.default, aten.arange.start, aten.arange.start_step}
# int arguments that are sizes (the longest sequence, for variable-length batches)
_SIZE_ARGS = {aten._scaled_dot_product_fused_attention_overrideable_backward.default:
              {"max_q", "max_k"}}


def _check_scalars(node: torch.fx.Node, sizes: _Sizes) -> None:
    """A padded size passed as a number (not a shape) would see the bucket size."""
    if node.target in _SIZE_VALUES:
        return  # arange(s0) at the bucket size is the true one plus a padded tail
    schema = node.target._schema
    values = dict(zip((a.name for a in schema.arguments), node.args))
    values.update(node.kwargs)
    for a in schema.arguments:
        if a.name in _SIZE_ARGS.get(node.target, ()):
            continue
        m = _val(values.get(a.name))
        if isinstance(m, torch.SymInt) and not str(a.type).startswith("SymInt") \
                and sizes.padded(_expr(m)):
            raise Unclassified(f"{node.target} with a padded size as a value")


def _placeholder_splits(gm, placeholders, sizes: _Sizes) -> dict:
    """A placeholder dim like 3*s1 is one factor, unless a view in the graph splits a
    dim of that size: then it has that view's factors (3, s1), so the view needs no
    reordering of valid positions (which would be unclassified)."""
    known: dict = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _VIEWS:
            continue
        dims = list(_plain(_val(node.args[0])))
        try:
            split = _split_like(dims, [_expr(s) for s in _val(node).shape])
        except Unclassified:
            continue
        for (size,), group in zip(dims, split):
            if len(group) > 1 and sizes.padded(size):
                known.setdefault(size, group)
    out = {}
    for p in placeholders:
        m = _val(p)
        if isinstance(m, torch.Tensor):
            out[p] = tuple(known.get(size, (size,)) for (size,) in _plain(m))
    return out


def _split_like(dims: list, out_sizes: list) -> Layout:
    """Each input dim as the run of output sizes whose product it is."""
    result, j = [], 0
    for (size,) in dims:
        group, rem = [], size
        while rem != 1 and j < len(out_sizes):
            q = sympy.cancel(rem / out_sizes[j])
            if not _is_poly(q):
                break
            group.append(out_sizes[j])
            rem, j = q, j + 1
        if rem != 1:
            raise Unclassified("no split")
        while j < len(out_sizes) and out_sizes[j] == 1:
            j += 1
        result.append(tuple(group) or (size,))
    return tuple(result)


# ------------------------------------------------------------ the op rules
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_SAME = {aten.clone.default, aten.detach.default, aten.alias.default,
         aten._to_copy.default, aten.lift_fresh_copy.default, aten.copy.default,
         aten.copy_.default}
_SUMS = {aten.sum.dim_IntList: 0, aten.sum.default: 0, aten.mean.dim: 0,
         aten.mean.default: 0, aten.amax.default: FILL_LOW, aten.amin.default: FILL_HIGH,
         aten.max.dim: FILL_LOW, aten.min.dim: FILL_HIGH, aten.argmax.default: FILL_LOW,
         aten.argmin.default: FILL_HIGH, aten.prod.dim_int: 1, aten.any.dim: 0,
         aten.any.dims: 0, aten.all.dim: 1, aten.logsumexp.default: FILL_LOW}
_MEANS = {aten.mean.dim, aten.mean.default}
_FACTORIES = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
              aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
              aten.new_empty.default, aten.scalar_tensor.default}


def _classify(node: torch.fx.Node, plan: Plan):
    """(output layout(s), NodeRule or None) of one op, or Unclassified."""
    target = node.target
    args = node.args
    lay = [plan.layouts.get(a) if isinstance(a, torch.fx.Node) else None for a in args]
    out = _val(node)
    rule = _RULES.get(target)
    if rule is not None:
        return rule(node, plan, lay)
    if torch.Tag.pointwise in target.tags or target in _SAME:
        return _pointwise(node, plan), None
    if target in _VIEWS:
        return regroup(lay[0], [_expr(s) for s in out.shape]), None
    if target in _SUMS:
        return _reduction(node, plan, lay)
    if target in _FACTORIES:
        return _plain(out), None
    inputs_padded = any(plan.padded(plan.layouts.get(a)) for a in _flat_args(node)
                        if isinstance(a, torch.fx.Node))
    outs = out if isinstance(out, (list, tuple)) else [out]
    layouts = [_plain(m) if isinstance(m, torch.Tensor) else None for m in outs]
    if inputs_padded or any(plan.padded(x) for x in layouts):
        raise Unclassified(str(target))
    return (layouts if isinstance(out, (list, tuple)) else layouts[0]), None


def _pointwise(node: torch.fx.Node, plan: Plan) -> Layout:
    """Broadcasting: each output dim takes the layout of the inputs that have it."""
    out = _val(node)
    tensors = [a for a in _flat_args(node) if isinstance(_val(a), torch.Tensor)]
    result = []
    n = out.dim()
    for d in range(n):
        size = _expr(out.shape[d])
        found = None
        for a in tensors:
            m, la = _val(a), plan.layouts.get(a)
            k = d - (n - m.dim())
            if k < 0 or la is None or _expr(m.shape[k]) != size:
                continue
            dim = la[k]
            if found is None:
                found = dim
            elif plan.sizes.dim_padded(dim) and _norm(dim) != _norm(found):
                raise Unclassified(f"{node.target} on differently padded operands")
        if found is None:
            found = (size,)
            if plan.sizes.padded(size):
                raise Unclassified(str(node.target))
        result.append(found)
    return tuple(result)


def _flat_args(node):
    for a in (*node.args, *node.kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _dims(arg, ndim: int) -> list[int]:
    if arg is None or arg == []:
        return list(range(ndim))
    dims = [arg] if isinstance(arg, int) else list(arg)
    return [d % ndim if ndim else 0 for d in dims]


def _reduction(node, plan: Plan, lay):
    x = _val(node.args[0])
    la = lay[0]
    target = node.target
    dim_arg = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if target in (aten.sum.default, aten.mean.default):
        dim_arg = None
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if target in (aten.argmax.default, aten.argmin.default) and dim_arg is None:
        raise Unclassified(f"{target} over all dims")  # a flat index over padded data
    reduced = _dims(dim_arg, x.dim())
    kept = tuple((sympy.Integer(1),) if d in reduced else la[d] for d in range(x.dim())
                 if keep or d not in reduced)
    outs = _val(node)
    layouts = [kept for _ in outs] if isinstance(outs, (list, tuple)) else kept
    if not any(plan.sizes.dim_padded(la[d]) for d in reduced):
        return layouts, None
    rule = NodeRule({0: _SUMS[target]})
    if target in _MEANS:
        rule.post = _mean_fix([la[d] for d in reduced])
    return layouts, rule


def _mean_fix(dims: list) -> Callable:
    def post(results, truth):
        ratio = 1.0
        for dim in dims:
            for f in dim:
                ratio = ratio * (truth.bucket(f) / truth.true(f))
        return [r * jnp.asarray(ratio, r.dtype) for r in results]

    return post


def _matmul(node, plan: Plan, lay):
    """mm/bmm/addmm/baddbmm: batch dims pass through; a padded contraction is masked."""
    target = node.target
    first = 1 if target in (aten.addmm.default, aten.baddbmm.default) else 0
    a, b = lay[first], lay[first + 1]
    ka, kb = a[-1], b[-2]
    out = a[:-1] + b[-1:]
    if first:
        _pointwise_check(node, plan, lay[0], out)
    if not (plan.sizes.dim_padded(ka) or plan.sizes.dim_padded(kb)):
        return out, None
    if _norm(ka) != _norm(kb):
        raise Unclassified(f"{target} contracting differently padded dims")
    return out, NodeRule({first: 0, first + 1: 0})


def _pointwise_check(node, plan: Plan, la, out: Layout) -> None:
    if la is None:
        return
    for dim, o in zip(reversed(la), reversed(out)):
        if plan.sizes.dim_padded(dim) and _norm(dim) != _norm(o):
            raise Unclassified(f"{node.target} with a differently padded bias")


def _permute(node, plan: Plan, lay):
    la = lay[0]
    t = node.target
    if t is aten.t.default:
        return (tuple(reversed(la)), None)
    if t is aten.transpose.int:
        d0, d1 = (d % len(la) for d in node.args[1:3])
        out = list(la)
        out[d0], out[d1] = out[d1], out[d0]
        return tuple(out), None
    return tuple(la[d % len(la)] for d in node.args[1]), None  # permute


def _unsqueeze(node, plan: Plan, lay):
    la = lay[0]
    d = node.args[1] % (len(la) + 1)
    return la[:d] + ((sympy.Integer(1),),) + la[d:], None


def _squeeze(node, plan: Plan, lay):
    la, m = lay[0], _val(node.args[0])
    dims = _dims(node.args[1] if len(node.args) > 1 else None, m.dim())
    return tuple(dim for d, dim in enumerate(la)
                 if not (d in dims and _expr(m.shape[d]) == 1)), None


def _expand(node, plan: Plan, lay):
    la, out = lay[0], _val(node)
    new = out.dim() - len(la)
    result = [(_expr(s),) for s in out.shape[:new]]
    for d, dim in enumerate(la):
        size = _expr(out.shape[new + d])
        result.append(dim if _norm(dim) == _norm((size,)) or _expr(
            _val(node.args[0]).shape[d]) != 1 else (size,))
    return tuple(result), None


def _along(node, plan: Plan, lay, dim_index: int, default: int = 0):
    """Ops that cut or select along one dim: fine unless that dim is padded."""
    m = _val(node.args[0])
    d = node.args[dim_index] if len(node.args) > dim_index else default
    d %= max(m.dim(), 1)
    la = lay[0]
    if plan.sizes.dim_padded(la[d]):
        if node.target is aten.slice.Tensor and _full_slice(node, m, d):
            return la, None
        raise Unclassified(f"{node.target} along a padded dim")
    out = _val(node)
    if node.target is aten.select.int:
        return la[:d] + la[d + 1:], None
    piece = lambda o: la[:d] + ((_expr(o.shape[d]),),) + la[d + 1:]  # noqa: E731
    if isinstance(out, (list, tuple)):
        return [piece(o) for o in out], None
    return piece(out), None


def _full_slice(node, m, d) -> bool:
    args = list(node.args) + [None] * 5
    start, end, step = args[2] or 0, args[3], args[4] or 1
    return start == 0 and step == 1 and (end is None or (isinstance(end, int) and end >= 2**62)
                                         or _expr(_val(end)) == _expr(m.shape[d]))


def _cat(node, plan: Plan, lay):
    tensors = node.args[0]
    d = node.args[1] if len(node.args) > 1 else 0
    out = _val(node)
    d %= out.dim()
    layouts = [plan.layouts.get(t) for t in tensors]
    if any(plan.sizes.dim_padded(la[d]) for la in layouts if la is not None):
        raise Unclassified(f"{node.target} along a padded dim")
    result = list(layouts[0])
    result[d] = (_expr(out.shape[d]),)
    for la in layouts[1:]:
        for k, dim in enumerate(la):
            if k != d and plan.sizes.dim_padded(dim) and _norm(dim) != _norm(result[k]):
                raise Unclassified(f"{node.target} of differently padded tensors")
    return tuple(result), None


def _softmax(node, plan: Plan, lay):
    la = lay[0]
    d = node.args[1] % len(la)
    if not plan.sizes.dim_padded(la[d]):
        return la, None
    return la, NodeRule({0: FILL_LOW})


def _softmax_backward(node, plan: Plan, lay):
    la = lay[0]
    d = node.args[2] % len(la)
    if not plan.sizes.dim_padded(la[d]):
        return la, None
    return la, NodeRule({0: 0, 1: 0})


def _layer_norm(node, plan: Plan, lay):
    la, m = lay[0], _val(node.args[0])
    n = len(node.args[1])
    if any(plan.sizes.dim_padded(d) for d in la[m.dim() - n:]):
        raise Unclassified(f"{node.target} over a padded dim")
    stats = la[:m.dim() - n] + ((sympy.Integer(1),),) * n
    return [la, stats, stats], None


def _layer_norm_backward(node, plan: Plan, lay):
    la, m = lay[1], _val(node.args[1])
    n = len(node.args[2])
    if any(plan.sizes.dim_padded(d) for d in la[m.dim() - n:]):
        raise Unclassified(f"{node.target} over a padded dim")
    outs = [la] + [_plain(o) if isinstance(o, torch.Tensor) else None for o in _val(node)[1:]]
    if not plan.padded(la):
        return outs, None
    return outs, NodeRule({0: 0, 1: 0, 3: 0, 4: 0})


def _embedding(node, plan: Plan, lay):
    w, idx = lay[0], lay[1]
    out = idx + w[1:]
    if plan.padded(w):
        raise Unclassified(f"{node.target} of a padded table")
    return out, (NodeRule({1: 0}) if plan.padded(idx) else None)


def _embedding_backward(node, plan: Plan, lay):
    if plan.padded(lay[1]) and (len(node.args) > 4 and node.args[4]):
        raise Unclassified(f"{node.target} with scale_grad_by_freq")
    if plan.sizes.dim_padded(lay[0][-1]):
        raise Unclassified(f"{node.target} with a padded embedding dim")
    out = _plain(_val(node))
    return out, (NodeRule({0: 0, 1: 0}) if plan.padded(lay[1]) else None)


def _ignore(node):
    return node.args[4]


def _nll_loss(node, plan: Plan, lay):
    x, target = lay[0], lay[1]
    if x is not None and len(x) == 2 and plan.sizes.dim_padded(x[1]):
        raise Unclassified(f"{node.target} with padded classes")
    reduction = node.args[3]
    loss = target if reduction == 0 else ()
    outs = [loss, ()]
    if not plan.padded(target):
        return outs, None
    return outs, NodeRule({0: 0, 1: ("arg", 4)})


def _nll_loss_backward(node, plan: Plan, lay):
    grad, x, target = lay[0], lay[1], lay[2]
    if len(x) == 2 and plan.sizes.dim_padded(x[1]):
        raise Unclassified(f"{node.target} with padded classes")
    if not plan.padded(target):
        return x, None
    fills = {1: 0, 2: ("arg", 5)}
    if plan.padded(grad):
        fills[0] = 0
    return x, NodeRule(fills)


def _attention(node, plan: Plan, lay, backward: bool):
    """Causal attention: for a valid query every attended key is valid, so with q, k, v
    zeroed at padded positions the sequence dims need nothing more."""
    names = [a.name for a in node.target._schema.arguments]
    first = 1 if backward else 0
    q, k = lay[first], lay[first + 1]
    values = dict(zip(names, node.args))
    values.update(node.kwargs)
    seq_padded = plan.sizes.dim_padded(q[-2]) or plan.sizes.dim_padded(k[-2])
    if seq_padded and not (values.get("is_causal") and values.get("attn_bias") is None
                           and not values.get("dropout_p") and _norm(q[-2]) == _norm(k[-2])):
        raise Unclassified(f"{node.target} over a padded sequence without a causal mask")
    if plan.sizes.dim_padded(q[-1]) or plan.sizes.dim_padded(k[-1]):
        raise Unclassified(f"{node.target} with a padded head dim")
    outs = _val(node)
    if backward:
        layouts = [lay[1], lay[2], lay[3], None]
    else:
        v = lay[2]
        layouts = [q[:-1] + v[-1:], q[:-1]] + [None] * (len(outs) - 2)
    layouts = [la if isinstance(o, torch.Tensor) and la is not None else
               (_plain(o) if isinstance(o, torch.Tensor) else None)
               for la, o in zip(layouts, outs)]
    if not any(plan.padded(x) for x in lay[first:first + 3]):
        return layouts, None
    tensors = [i for i, a in enumerate(node.args) if isinstance(_val(a), torch.Tensor)]
    return layouts, NodeRule({i: 0 for i in tensors})


def _arange(node, plan: Plan, lay):
    out = _val(node)
    if node.target is aten.arange.start_step and plan.sizes.padded(_expr(out.shape[0])):
        start, step = node.args[0], node.args[2] if len(node.args) > 2 else 1
        if not (isinstance(start, int) and step == 1):
            raise Unclassified(f"{node.target} with a symbolic start")
    return _plain(out), None


_RULES: dict[Any, Callable] = {
    aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.addmm.default: _matmul,
    aten.baddbmm.default: _matmul,
    aten.t.default: _permute, aten.transpose.int: _permute, aten.permute.default: _permute,
    aten.unsqueeze.default: _unsqueeze, aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze, aten.squeeze.default: _squeeze,
    aten.expand.default: _expand,
    aten.select.int: lambda n, p, la: _along(n, p, la, 1),
    aten.slice.Tensor: lambda n, p, la: _along(n, p, la, 1),
    aten.split.Tensor: lambda n, p, la: _along(n, p, la, 2),
    aten.split_with_sizes.default: lambda n, p, la: _along(n, p, la, 2),
    aten.cat.default: _cat,
    aten._softmax.default: _softmax, aten._log_softmax.default: _softmax,
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _softmax_backward,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
    aten.nll_loss_forward.default: _nll_loss,
    aten.nll_loss_backward.default: _nll_loss_backward,
    aten._scaled_dot_product_fused_attention_overrideable.default:
        lambda n, p, la: _attention(n, p, la, backward=False),
    aten._scaled_dot_product_fused_attention_overrideable_backward.default:
        lambda n, p, la: _attention(n, p, la, backward=True),
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
}


# ------------------------------------------------- inside the program (traced)
class Truth:
    """Bucket sizes (static ints) and true sizes (traced) of the bucketed symbols."""

    def __init__(self, buckets: dict, trues: dict):
        self.buckets = buckets
        self.trues = trues

    def bucket(self, expr: sympy.Expr) -> int:
        return evaluate(expr, self.buckets)

    def true(self, expr: sympy.Expr):
        return evaluate(expr, self.trues)

    def digits(self, dim: Dim):
        """Each factor's digit of the dim's bucket index (a 1-D iota), with its factor."""
        radices = [self.bucket(f) for f in dim]
        index = lax.iota(jnp.int64, math.prod(radices))
        out, below = [], math.prod(radices)
        for f, r in zip(dim, radices):
            below //= r
            out.append((f, (index // below) % r))
        return out

    def dim_valid(self, dim: Dim, sizes: _Sizes):
        """The 1-D mask of a dim's valid positions, or None where all are valid."""
        mask = None
        for f, digit in self.digits(dim):
            if sizes.padded(f):
                ok = digit < self.true(f)
                mask = ok if mask is None else mask & ok
        return mask

    def dim_index(self, dim: Dim):
        """The true index (in the unpadded dim) of each bucket position."""
        index = 0
        for f, digit in self.digits(dim):
            index = index * self.true(f) + digit
        return index


def valid_mask(layout: Layout, sizes: _Sizes, truth: Truth, shape: tuple):
    """A boolean array broadcastable to `shape`: True at valid positions."""
    mask = None
    for d, dim in enumerate(layout):
        m = truth.dim_valid(dim, sizes)
        if m is None:
            continue
        m = m.reshape([-1 if k == d else 1 for k in range(len(shape))])
        mask = m if mask is None else mask & m
    return mask


def fill_value(fill, dtype, values: list):
    """A fill as an array of `dtype`: a number, the dtype's extreme, or an argument."""
    if isinstance(fill, tuple):  # ("arg", i): e.g. nll_loss's ignore_index
        return jnp.asarray(values[fill[1]], dtype)
    if fill in (FILL_LOW, FILL_HIGH):
        if jnp.issubdtype(dtype, jnp.floating):
            return jnp.asarray(-jnp.inf if fill == FILL_LOW else jnp.inf, dtype)
        if dtype == jnp.bool_:
            return jnp.asarray(fill == FILL_HIGH)
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.min if fill == FILL_LOW else info.max, dtype)
    return jnp.asarray(fill, dtype)


def mask(x, layout: Layout, sizes: _Sizes, truth: Truth, fill):
    """`x` with its padded positions set to `fill` (where, so inf/NaN cannot leak)."""
    m = valid_mask(layout, sizes, truth, x.shape)
    return x if m is None else jnp.where(m, x, fill)


def identity(layout: Layout, sizes: _Sizes) -> bool:
    """A valid element has the same index at bucket and true sizes: only the outermost
    factor of each dim is padded."""
    return all(not any(sizes.padded(f) for f in dim[1:]) for dim in layout)


def true_offsets(layout: Layout, strides: Sequence, truth: Truth, shape: tuple):
    """The storage offset (true layout) of each bucket position."""
    pos = 0
    for d, (dim, stride) in enumerate(zip(layout, strides)):
        idx = truth.dim_index(dim).reshape([-1 if k == d else 1 for k in range(len(shape))])
        pos = pos + idx * stride
    return jnp.broadcast_to(pos, shape)


def gather(flat, layout: Layout, sizes: _Sizes, truth: Truth, shape: tuple, offset, strides):
    """An input stored in its true layout, read into the bucket shape (zero padded)."""
    pos = true_offsets(layout, strides, truth, shape) + offset
    m = valid_mask(layout, sizes, truth, shape)
    pos = jnp.clip(pos, 0, flat.shape[0] - 1)
    x = flat[pos]
    return x if m is None else jnp.where(m, x, jnp.zeros((), x.dtype))


def scatter(y, layout: Layout, sizes: _Sizes, truth: Truth, strides: Sequence, capacity: int):
    """A result at the bucket shape written into a flat buffer in its true layout."""
    pos = true_offsets(layout, strides, truth, y.shape)
    m = valid_mask(layout, sizes, truth, y.shape)
    if m is not None:
        pos = jnp.where(m, pos, capacity)  # out of bounds: dropped
    return jnp.zeros((capacity,), y.dtype).at[pos.reshape(-1)].set(y.reshape(-1), mode="drop")
