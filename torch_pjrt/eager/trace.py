"""Tracing one op signature: the function jax.jit compiles, which reads the input views
from their storages, calls the lowering, lays the outputs out with PyTorch's strides and
writes the mutated views back into their storages."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.extend.core import jaxpr_as_fun

from ..lowering import apply, checks
from ..runtime import warm_start
from ..storage import dtypes, views
from . import graph
from .call_key import DYNAMIC, tensor_args, unhashable
from .errors import ExecutionError, runtime_error
from .opspec import (
    GENERATOR,
    OPT_TENSOR,
    OPT_TENSOR_LIST,
    SCALAR,
    SCALAR_LIST,
    TENSOR,
    TENSOR_LIST,
    OpSpec,
)

if TYPE_CHECKING:
    from .call_key import Call
    from .op_cache import Entry


def trace_now(call: Call, entry: Entry) -> None:
    """Fused mode: the lowering traced at the op (its errors are the op's, as in strict
    mode) into the jaxpr its graphs evaluate, instead of tracing it in every graph. Not
    for a signature that has traced before (also in an earlier process): a warm start
    loads its graphs from disk and traces nothing."""
    if warm_start.traced_before(entry.digest):
        entry.checked = warm_start.checks_data(entry.digest)
        return
    args = [_aval(call.recs[i].value) for i in entry.order]
    dyn = list(call.dyn) + ([np.uint64(0), np.uint64(0)] if entry.random else [])
    try:
        entry.closed = jax.make_jaxpr(entry.trace)(*args, *dyn)
        entry.jaxpr = jaxpr_as_fun(entry.closed)
    except Exception as e:  # noqa: BLE001 - the lowering's errors become PyTorch's
        raise runtime_error(call.spec, e) from e
    warm_start.note_traced(entry.digest, entry.checked)


def _aval(value):
    """A storage's value as make_jaxpr takes it: a pending one by its shape and dtype."""
    if type(value) is graph.Lazy:
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    return value


def make_trace(spec: OpSpec, key: tuple, entry: Entry, compute, computed,
               buffer_shapes: dict[int, tuple]):
    """The function jax.jit traces for one signature of one op: it takes the storages'
    buffers in `entry.order` (`buffer_shapes`: each one's numel and dtype), then the
    run-time values."""
    lowering = spec.lowering
    arg_parts = key[1:]
    meta_structs = [None if m is None else
                    jax.ShapeDtypeStruct(tuple(m.shape), dtypes.to_jax(m.dtype))
                    for m in computed]
    out_specs = [None if o is None else o[:3] for o in entry.outs]  # shape, stride, dtype
    n_targets = len(entry.targets)

    order = entry.order
    n_bufs = len(order)
    flat_math = _shape_agnostic(spec, key)
    if flat_math:  # what a lowering sees of its outputs: 1-D too
        meta_structs = [m if m is None or len(m.shape) < 2 else
                        jax.ShapeDtypeStruct((math.prod(m.shape),), m.dtype)
                        for m in meta_structs]

    one_at_a_time = _overlapping_foreach(spec, entry)

    def trace(*flat):
        bufs = [None] * n_bufs
        for i, b in zip(order, flat[:n_bufs]):
            bufs[i] = b
        dyn = flat[n_bufs:]
        for i, b in enumerate(bufs):
            if b is None:  # an uninitialized storage reads as zeros
                numel, dtype = buffer_shapes[i]
                bufs[i] = jnp.zeros((numel,), dtype)
        dyn_iter = iter(dyn)
        at = {}  # (argument, list index) -> the run-time offset of a view given one
        new_bufs = {}

        def write(target, slot, val):
            buf, dtype, shape, stride, offset, view_flags = target
            val = _resolve_flags(apply.broadcast_cast(val, shape, dtypes.to_jax(dtype)),
                                 view_flags)  # an involution: stored as the view reads it
            base = new_bufs.get(buf, bufs[buf])
            dynamic = offset == DYNAMIC
            if dynamic:
                offset = at[slot]
            if dtype is torch.complex32:
                val = views.to_parts(val)
                shape, stride, offset = views.complex32_parts(shape, stride, offset)
            if dynamic:
                new_bufs[buf] = views.write_at(base, val, shape, stride, offset)
            else:
                new_bufs[buf] = views.write(base, val, shape, stride, offset)

        def view(buf, part, slot):
            """The tensor `part` describes, read from `buf` (at its run-time offset, where
            it has one: at[slot])."""
            _, dtype, shape, stride, offset = part[:5]
            if flat_math and len(shape) > 1:  # see _shape_agnostic
                shape, stride = (math.prod(shape),), (1,)
            dynamic = offset == DYNAMIC  # a view at an offset given at run time
            if dynamic:
                offset = at[slot]
            parts = dtype is torch.complex32
            if parts:
                shape, stride, offset = views.complex32_parts(shape, stride, offset)
            jdtype = dtypes.buffer(dtype)
            if dynamic:
                value = views.read_at(buf, shape, stride, offset, jdtype)
            else:
                value = views.read(buf, shape, stride, offset, jdtype)
            return _resolve_flags(views.from_parts(value) if parts else value, part[8])

        def reread(part, slot):
            """A list element read again, after the writes before it (_in_order)."""
            return view(new_bufs.get(part[0], bufs[part[0]]), part, slot)

        def _in_order(values):
            """A foreach op whose written tensors overlap, one list element after another
            (as the CPU's loop over the list): element i reads what elements < i wrote."""
            results = []
            for i in range(one_at_a_time):
                step = []
                for pos, (a, part, v) in enumerate(zip(spec.args, arg_parts, values)):
                    if a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
                        p = part[i]
                        tensor = p is not None and p[0] not in ("cpu0", "num")
                        step.append([reread(p, (pos, i)) if tensor else v[i]])
                    elif a.kind == SCALAR_LIST:
                        step.append([v[i]])
                    else:
                        step.append(v)
                metas = None if meta_structs is None else [meta_structs[i]]
                val = apply.invoke(spec, step, compute, metas, None, None)[0]
                if flat_math:
                    val = _unflatten(val, entry.targets[i][2])
                write(entry.targets[i], entry.target_slots[i], val)
                results.append(val)
            return results

        def read(part, slot):
            if part is None:
                return None
            if part[0] == "cpu0":
                return jnp.asarray(next(dyn_iter), dtypes.to_jax(part[1]))
            if part[0] == "num":
                return next(dyn_iter)
            if part[4] == DYNAMIC:
                at[slot] = next(dyn_iter)
            return view(bufs[part[0]], part, slot)

        values = []
        for pos, (a, part) in enumerate(zip(spec.args, arg_parts)):
            kind = a.kind
            if kind == GENERATOR:
                values.append(None)
            elif spec.is_out and a.write:  # not read; its run-time offsets, in order
                for j, p in enumerate(part if kind in (TENSOR_LIST, OPT_TENSOR_LIST)
                                      else (part,)):
                    if p is not None and p[0] not in ("cpu0", "num") and p[4] == DYNAMIC:
                        at[(pos, j)] = next(dyn_iter)
                values.append(None)
            elif kind in (TENSOR, OPT_TENSOR):
                values.append(read(part, (pos, 0)))
            elif kind in (TENSOR_LIST, OPT_TENSOR_LIST):
                values.append([read(p, (pos, j)) for j, p in enumerate(part)])
            elif kind == SCALAR:  # a static Python number, or a run-time value
                values.append(part[1] if isinstance(part, tuple) else next(dyn_iter))
            elif kind == SCALAR_LIST:
                values.append([next(dyn_iter) for _ in part[1]])
            else:
                values.append(unhashable(part))
        if spec.dtype_from_out is not None and values[spec.dtype_from_out] is None:
            values[spec.dtype_from_out] = arg_parts[spec.mutated[0]][1]
        rng = None
        if lowering.random:
            seed, offset = next(dyn_iter), next(dyn_iter)
            rng = jax.random.fold_in(jax.random.key(seed), offset)
        contiguous = None
        if lowering.wants_layout:  # each tensor argument's layout, from its key part
            contiguous = tuple(views.is_contiguous(part[2], part[3])
                               if part is not None and part[0] != "cpu0" else True
                               for a, part in zip(spec.args, arg_parts)
                               if a.kind in (TENSOR, OPT_TENSOR))
        with checks.CheckCollector() as collected:
            if one_at_a_time:
                results = _in_order(values)
            else:
                results = apply.invoke(spec, values, compute, meta_structs, rng, contiguous)
        entry.checks = collected.infos()
        entry.checked = entry.checks is not None

        target_vals = results[:n_targets] if spec.mutated else []
        fresh_vals = results[n_targets:] if spec.mutated else results
        if flat_math:
            target_vals = [_unflatten(v, t[2]) for v, t in zip(target_vals, entry.targets)]
            fresh_vals = [v if o is None else _unflatten(v, o[0])
                          for v, o in zip(fresh_vals, out_specs)]
        if len(fresh_vals) != len(out_specs):
            raise ExecutionError(
                f"the lowering of {spec.op} returned {len(results)} arrays; expected "
                f"{n_targets} written + {len(out_specs)} new")
        outs = [_layout(v, *o) for v, o in zip(fresh_vals, out_specs) if o is not None]
        if not one_at_a_time:  # (_in_order wrote each target as it went)
            for target, slot, val in zip(entry.targets, entry.target_slots, target_vals):
                write(target, slot, val)
        flags = (collected.flags(),) if entry.checks else ()
        return tuple(outs) + tuple(new_bufs[b] for b in entry.written) + flags

    return trace


def _overlapping_foreach(spec: OpSpec, entry) -> int:
    """How many elements an in-place foreach op runs one at a time (0: all at once): where
    two of the tensors it writes may overlap (one storage, element ranges that meet, or an
    offset known only at run time). The CPU applies the list one tensor after another, so
    _foreach_add_([x[3], x[:, 3]], 3) adds 6 at x[3, 3]; at once, each would read the old
    value and the last write would win."""
    lowering = spec.lowering
    if (not spec.op._schema.name.startswith("aten::_foreach_") or spec.is_out
            or len(spec.mutated) != 1 or entry.outs or lowering.wants_layout
            or lowering.random):
        return 0
    seen: dict[int, list] = {}
    for buf, _, shape, stride, offset, _ in entry.targets:
        if 0 in shape:
            continue
        span = views.span(shape, stride)
        lo = None if offset == DYNAMIC else offset
        for lo2, hi2 in seen.get(buf, ()):
            if lo is None or lo2 is None or (lo < hi2 and lo2 < lo + span):
                return len(entry.targets)
        seen.setdefault(buf, []).append((lo, None if lo is None else lo + span))
    return 0


def _shape_agnostic(spec: OpSpec, key: tuple) -> bool:
    """Whether the op may run on its tensors as 1-D arrays: an elementwise op (or a foreach
    op, elementwise or reducing a whole tensor: all but _foreach_mm) whose tensors are
    contiguous, with one shape per position. Then a parameter update reads and writes its
    flat storage without a reshape between them, which XLA needs to update a donated
    buffer in place (with one, it copies every parameter and optimizer state instead)."""
    op = spec.op
    name = op._schema.name
    if not (torch.Tag.pointwise in op.tags or op is torch.ops.aten.copy_.default or
            (name.startswith("aten::_foreach_") and name != "aten::_foreach_mm")):
        return False
    shapes: dict[int, tuple] = {}  # list position -> the shape of the tensors there
    for _, position, p in tensor_args(spec, key[1:]):
        if p is None or not isinstance(p[0], int):
            continue  # absent, or a CPU scalar / number
        shape, stride = tuple(p[2]), tuple(p[3])
        if not shape:
            continue  # 0-d: broadcasts against 1-D like against any shape
        if not views.is_contiguous(shape, stride):
            return False
        if shapes.setdefault(position, shape) != shape:
            return False
    return any(len(s) > 1 for s in shapes.values())


def _unflatten(value, shape):
    """A result of a shape-agnostic op computed on 1-D arrays, at its tensor shape."""
    if value is None or value.ndim != 1 or tuple(shape) == value.shape:
        return value
    return value.reshape(shape)


def _resolve_flags(x, flags: int):
    """A view's values from its storage's: PyTorch's lazy conjugate and negative views
    (`x.conj()` of a complex tensor, `_neg_view`) set a bit instead of copying."""
    if flags & 1:
        x = jnp.conj(x)
    if flags & 2:
        x = -x
    return x


def _layout(value, shape, stride, dtype: torch.dtype):
    """A result in PyTorch's output layout, as the flat buffer of its storage. None where
    the meta kernel says a tensor is returned means an undefined gradient: zeros, as
    PyTorch materializes them."""
    jdtype = dtypes.to_jax(dtype)
    if value is None:
        value = jnp.zeros(shape, jdtype)
    value = apply.broadcast_cast(value, shape, jdtype)
    if dtype is torch.complex32:
        value = views.to_parts(value)
        shape, stride, _ = views.complex32_parts(shape, stride, 0)
    n = math.prod(shape)
    if views.span(shape, stride) == n:
        return views.to_flat(value, stride)
    flat = jnp.zeros((views.span(shape, stride),), value.dtype)
    return views.write(flat, value, shape, stride, 0)
