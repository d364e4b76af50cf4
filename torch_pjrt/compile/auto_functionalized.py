"""Operators that mutate their inputs, in compiled graphs: AOTAutograd's
`auto_functionalized_v2` nodes, computed with the operator's own lowering.

Functionalization replaces a call of a mutating custom op (`mutates_args`) with
`auto_functionalized_v2(op, _all_bases=[...], <view of each mutated argument>, ...)`,
whose value is (the op's outputs, then every base with the op's writes applied). Here
each base is laid out in a flat buffer with its own strides, each mutated argument
read from it as the view it was, the op's lowering called, and the new values written
back through the same views: what the op does to storages in eager mode, as a function.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
import torch.fx
from torch._higher_order_ops import auto_functionalize as hop

from ..eager import opspec
from ..lowering import apply
from ..storage import dtypes, views

_TARGETS = (hop.auto_functionalized_v2,)


def is_node(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _TARGETS


class Plan:
    """What the interpreter needs for one auto_functionalized_v2 node, fixed at compile
    time: the op's spec, each base's layout and each mutated argument's view of its base.
    Raises NotImplementedError where it cannot (no lowering, symbolic sizes)."""

    def __init__(self, node: torch.fx.Node, index: int):
        self.node, self.index = node, index
        op = node.args[0]
        if not isinstance(op, torch._ops.OpOverload):
            raise NotImplementedError(f"auto_functionalized_v2 of {op}")
        self.spec = opspec.spec(op)
        if self.spec.lowering is None:
            raise NotImplementedError(str(op))
        kwargs = dict(node.kwargs)
        base_nodes = kwargs.pop("_all_bases")
        self.bases = []  # per base: (shape, stride, offset, jax dtype, numel of its buffer)
        meta_bases = []
        for b in base_nodes:
            m = b.meta.get("val")
            if not isinstance(m, torch.Tensor) or _symbolic(m):
                raise NotImplementedError(f"{op} on a base of symbolic size")
            shape, stride, offset = tuple(m.shape), tuple(m.stride()), m.storage_offset()
            numel = views.span(shape, stride) + offset
            self.bases.append((shape, stride, offset, dtypes.to_jax(m.dtype), numel))
            meta_bases.append(torch.empty((numel,), dtype=m.dtype, device="meta")
                              .as_strided(shape, stride, offset))
        names, types = hop.get_mutable_args(op)
        infos = hop.read_view_information_from_args(names, types, kwargs, base_nodes)
        self.views = {}  # mutated argument -> (base index, shape, stride, offset) or None
        for name in names:
            info = infos[name]
            if isinstance(info, list):
                raise NotImplementedError(f"{op} mutating a list of tensors")
            if info is None:
                self.views[name] = None
                continue
            v = info.regenerate_view(meta_bases)
            if _symbolic(v):
                raise NotImplementedError(f"{op} mutating a view of symbolic size")
            self.views[name] = (info.base_index, tuple(v.shape), tuple(v.stride()),
                                v.storage_offset())
        self.arg_nodes = kwargs  # the op's other arguments, by name
        val = node.meta.get("val")
        n_returns = len(op._schema.returns)
        self.returns_list = n_returns == 1 and isinstance(op._schema.returns[0].type,
                                                           torch.ListType)
        outs = list(val[:max(n_returns, 1)]) if n_returns else []
        if self.returns_list:
            outs = list(outs[0])
        self.structs = [None if not isinstance(m, torch.Tensor) else
                        _struct(m) for m in outs]
        self.n_returns = n_returns

    def run(self, value, key=None) -> tuple:
        """(outputs..., new bases...) from the graph's values (`value` maps an FX argument
        to its array)."""
        storages = [_to_buffer(value(b), layout) for b, layout in
                    zip(self.node.kwargs["_all_bases"], self.bases)]
        by_name = {name: value(v) for name, v in self.arg_nodes.items()}
        for name, view in self.views.items():
            by_name[name] = None if view is None else views.read(storages[view[0]], *view[1:])
        values = opspec.normalize(self.spec, (), by_name)
        results = apply.invoke(self.spec, values, None, self.structs, key)
        n_mutated = len(self.spec.mutated)
        for i, new in zip(self.spec.mutated, results[:n_mutated]):
            view = self.views[self.spec.args[i].name]
            if view is None:
                continue
            b, shape, stride, offset = view
            new = apply.broadcast_cast(new, shape, self.bases[b][3])
            storages[b] = views.write(storages[b], new, shape, stride, offset)
        new_bases = [views.read(s, shape, stride, offset)
                     for s, (shape, stride, offset, _, _) in zip(storages, self.bases)]
        outs = results[n_mutated:]
        if self.returns_list:
            return (list(outs), *new_bases)
        if self.n_returns == 0:
            return (None, *new_bases)
        return (*outs, *new_bases)


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))


def _struct(m: torch.Tensor):
    import jax

    return jax.ShapeDtypeStruct(tuple(m.shape), dtypes.to_jax(m.dtype))


def _to_buffer(base, layout):
    """A base's values in a flat buffer laid out with its strides (its storage, as far as
    the graph can see it)."""
    shape, stride, offset, dtype, numel = layout
    base = apply.broadcast_cast(base, shape, dtype)
    if offset == 0 and numel == math.prod(shape) and views.is_contiguous(shape, stride):
        return base.reshape(-1)
    return views.write(jnp.zeros((numel,), dtype), base, shape, stride, offset)
