"""The op executor: one cached XLA executable per (op, input signature, static args).

For each call the executor builds a key from the op and its arguments (storage
buffer, dtype, shape, stride and offset of every tensor; static arguments by
value; Python scalars by type only, passed at run time). On a miss it runs the
op on meta tensors (PyTorch's own shape and dtype checks, and the output
layout), traces the lowering into one jitted program that reads the input
views, computes, lays the outputs out with PyTorch's strides and writes
mutated views back into their storages, and caches it. A hit costs the key,
a dictionary lookup and one launch.

Calls are keyed natively first: the PrivateUse1 kernel of every lowered op is
C++ (runtime/native/op_kernel.cpp), which packs the same metadata into a key of
its own, under which the entry is filed too the first time the Python key finds
it. On a fused hit of an op that returns one fresh tensor, or the one argument
it writes in place, it records the op itself; every other call comes here
through native_call. Calls made from Python (kernel()) are keyed natively by
the same code (lookup).
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.extend.core import jaxpr_as_fun

from .. import counters
from ..lowering import apply, checks
from ..runtime import compile_cache, cpu_kernels, warm_start
from ..storage import dtypes, table, views
from . import debug, graph, modes, opspec
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

_records = table._records
_new_tensor = table.new_tensor
_record_single = graph.record_single
_native = None  # set by install()
_PJRT = None  # the torch device type name, set by install()


def install(native, device_type: str) -> None:
    global _native, _PJRT, _lookup
    from ..runtime import memory

    _native = native
    _PJRT = device_type
    _lookup = native.lookup
    native.configure_op_kernel(
        vars(graph), vars(modes), counters._counters, memory._devices, table._records, _cache,
        native_call, graph.flush_due, graph.Node, graph.Lazy, table.StorageRecord, Entry,
        memory.DeviceMemory)


def _lookup(plan, args, records, cache):  # replaced by the shim's at install()
    return None


class ExecutionError(RuntimeError):
    pass


# ----------------------------------------------------------------- the cache
class Entry:
    """A compiled op for one input signature."""

    __slots__ = ("fn", "trace", "order", "n_results", "result_avals", "outs", "single",
                 "targets", "written", "donate", "resize", "checks", "name", "digest", "device",
                 "signature", "values", "random", "call", "ordered", "alias_return", "products",
                 "jaxpr", "alone")

    def __init__(self):
        self.fn = None  # launches the jitted program (strict and debug modes)
        self.call = None  # the compiled program, once fn has compiled it, if it takes the
        # storage buffers in argument order (no donation reorders them)
        self.trace = None  # the traced function itself, which fused graphs call
        self.order: list[int] = []  # storage buffers in argument order (donated first)
        self.ordered = False  # order is the buffers' own order (nothing donated first)
        self.n_results = 0  # arrays the program returns, device-side check flags excluded
        self.result_avals: list[tuple] = []  # (shape, dtype) of each of those arrays
        self.name = ""
        self.digest = ""  # stable across processes: names the program in the disk cache
        self.device = 0
        self.signature = ""  # the op and its input shapes, for recompile messages
        self.values: dict[int, Any] = {}  # non-tensor returns (from the meta kernel)
        self.random = False  # the lowering takes an RNG key
        self.products = False  # the lowering computes matrix products (cpu_kernels)
        # (shape, stride, torch dtype, jax dtype, storage bytes) of each fresh output
        self.outs: list[tuple] = []
        self.single = False  # the op returns exactly one fresh tensor
        self.alias_return: int | None = None  # the op returns only this argument (in place)
        # (buf, dtype, shape, stride, offset, view flags) of each written view
        self.targets: list[tuple] = []
        self.written: tuple[int, ...] = ()  # storage buffers the program returns, in order
        self.donate: tuple[int, ...] = ()  # written buffers whose old value is donated
        self.resize: list[tuple[int, tuple]] | None = None  # out= tensors to resize first
        self.checks: list[tuple] | None = None  # (error, message) of device-side checks
        # What fused graphs evaluate: the traced lowering as a function of its flat
        # inputs (set where fused mode first records the signature; else they trace).
        self.jaxpr = None
        # Runs as its own program in fused mode too: a torch.compile graph, already one
        # XLA program, cached and loaded apart from the eager code around it.
        self.alone = False

    def set_checks(self, checks: list | None) -> None:
        """Device-side checks of a program loaded from disk (tracing would have found them)."""
        self.checks = checks


_cache: dict[tuple, Entry] = {}


def cache_size() -> int:
    """Compiled op signatures (the cache also files entries under the native keys)."""
    return sum(1 for k in _cache if type(k[0]) is tuple)


# ------------------------------------------------------------- device errors
def _device_mismatch(spec: OpSpec, a: torch.device, b: torch.device) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}! (when checking arguments for {spec.op})"
    )


# --------------------------------------------------------------- signatures
class _Call:
    """The per-call state gathered while building the key."""

    __slots__ = ("spec", "values", "recs", "bufidx", "dyn", "device")

    def __init__(self, spec: OpSpec, values: list):
        self.spec = spec
        self.values = values
        self.recs: list[table.StorageRecord] = []
        self.bufidx: dict[int, int] = {}
        self.dyn: list[Any] = []
        self.device: int | None = None

    def tensor_part(self, t) -> tuple:
        """(buffer, dtype, shape, stride, offset, storage numel, storage dtype, uninitialized,
        view flags: 1 conjugate bit, 2 negative bit)."""
        try:
            ptr = t.untyped_storage().data_ptr()
        except AttributeError:  # a Python number PyTorch wrapped as a tensor
            self.dyn.append(t)
            return ("num", type(t))
        idx = self.bufidx.get(ptr)
        if idx is None:
            rec = _records.get(ptr)
            if rec is None:
                rec = self._other_tensor(t)
                if rec is None:
                    return ("cpu0", t.dtype)
            if self.device is None:
                self.device = rec.device
            elif rec.device != self.device:
                raise _device_mismatch(self.spec, torch.device(_PJRT, self.device), t.device)
            idx = self.bufidx[ptr] = len(self.recs)
            self.recs.append(rec)
        else:
            rec = self.recs[idx]
        return (idx, t.dtype, t.shape, t.stride(), t.storage_offset(), rec.numel,
                rec.dtype, rec.value is None, t.is_conj() + 2 * t.is_neg())

    def _other_tensor(self, t: torch.Tensor) -> table.StorageRecord | None:
        """A tensor whose storage is not in the table: foreign pjrt, CPU scalar, or an error."""
        if t.device.type == _PJRT:
            return table.record(t.untyped_storage())
        if t.dim() == 0 and t.device.type == "cpu":
            self.dyn.append(t.item())
            return None
        here = torch.device(_PJRT, self.device if self.device is not None else 0)
        raise _device_mismatch(self.spec, here, t.device)


def _key(call: _Call) -> tuple:
    spec = call.spec
    parts: list = [spec.op]
    dyn = call.dyn
    bufidx = call.bufidx
    for kind, a, v in zip(spec.kinds, spec.args, call.values):
        if kind == TENSOR:
            # call.tensor_part(v), inlined for the common case: a pjrt tensor whose storage
            # is in the table and not seen yet in this call.
            try:
                ptr = v.untyped_storage().data_ptr()
            except AttributeError:
                parts.append(call.tensor_part(v))
                continue
            rec = _records.get(ptr)
            if rec is None or ptr in bufidx or (call.device is not None
                                                and rec.device != call.device):
                parts.append(call.tensor_part(v))
                continue
            call.device = rec.device
            idx = bufidx[ptr] = len(call.recs)
            call.recs.append(rec)
            parts.append((idx, v.dtype, v.shape, v.stride(), v.storage_offset(), rec.numel,
                          rec.dtype, rec.value is None, v.is_conj() + 2 * v.is_neg()))
        elif kind == SCALAR:
            if a.name in spec.static_scalars or (v == a.default and type(v) is type(a.default)):
                parts.append(("s", v))
            else:
                dyn.append(v)
                parts.append(type(v))
        elif kind == OPT_TENSOR:
            parts.append(None if v is None else call.tensor_part(v))
        elif kind == TENSOR_LIST or kind == OPT_TENSOR_LIST:
            parts.append(tuple(None if t is None else call.tensor_part(t) for t in v))
        elif kind == SCALAR_LIST:  # run-time values, like Scalar (an optimizer's step sizes)
            dyn.extend(v)
            parts.append(("sl", tuple(type(x) for x in v)))
        elif kind == GENERATOR:
            parts.append(GENERATOR)
        else:
            parts.append(_hashable(v))
    return tuple(parts)


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, torch.device):
        return ("device", v.type)  # the index is the call's device, not part of the program
    return v


# ---------------------------------------------------------------- execution
_counts = counters._counters


def kernel(spec: OpSpec, /, *args, **kwargs):
    """Run `spec.op` on pjrt tensors with its lowering, compiling on first use: for the
    calls made from Python (the PrivateUse1 kernel of lowered ops is native_call's)."""
    if kwargs or modes.debug:
        return _execute(spec, args, kwargs, None)
    # The common case, keyed natively: (entry, recs, dyn, device, values) on a hit.
    return native_call(spec, _lookup(spec.plan, args, _records, _cache), args)


def native_call(spec: OpSpec, hit: tuple | None, args: tuple):
    """A call as the native key found it (runtime/native/op_kernel.cpp: the kernel of
    lowered ops, every schema argument in `args`; or kernel() above): `hit` is
    (entry, recs, dyn, device, values), (None, key) on a miss, or None where the call
    needs the Python key. The native kernel records the common fused hits itself."""
    if hit is None or modes.debug:
        return _execute(spec, args, {}, None)
    entry = hit[0]
    if entry is None:
        return _execute(spec, args, {}, hit[1])
    _counts["cache_hits"] += 1
    if modes.fused and not entry.alone:
        if not entry.single:
            return _run_fused(spec, entry, hit, args)
        out = _record_single(entry, hit[1], hit[2], hit[3], hit[4] if entry.ordered else None)
        if graph.due:
            graph.flush_due()
        return out
    return _run_strict(spec, entry, hit, args)


def execute(spec: OpSpec, args: tuple, kwargs: dict):
    """kernel(), with the op's arguments as a tuple and a dict."""
    return kernel(spec, *args, **kwargs)


def _execute(spec: OpSpec, args: tuple, kwargs: dict, fast_key: tuple | None):
    """The Python key: every call the native key does not cover, and the first of each
    signature (`fast_key`: the native key to file the entry under as well)."""
    values = opspec.normalize(spec, args, kwargs)
    call = _Call(spec, values)
    key = _key(call)
    if call.device is None:  # a factory: the device comes from its arguments
        call.device = _factory_device(spec, values)
    key = (key, call.device)  # programs are compiled for one device
    entry = _cache.get(key)
    if entry is None:
        return _execute_miss(call, key, fast_key)
    _counts["cache_hits"] += 1
    if entry.resize is not None:
        return _resize_and_run(call, entry)
    if fast_key is not None and not entry.random:
        _cache[fast_key] = entry
    return _launch(call, entry)


def _execute_miss(call: _Call, key: tuple, fast_key: tuple | None = None):
    """A new signature: compiled; cached once it has traced (an op whose lowering fails
    stays uncached, so that every call of it raises, in every mode)."""
    counters.count("cache_misses")
    entry = _compile(call, key[0])
    if entry.resize is not None:
        _cache[key] = entry
        return _resize_and_run(call, entry)
    fused = modes.fused and not entry.alone
    if fused:  # compiled as part of its graph; traced now, so that errors raise here
        _trace_now(call, entry)
    else:
        counters.count("compiles")
        start = time.perf_counter()
        try:
            out = _launch(call, entry)
        finally:
            counters.add_compile_time(time.perf_counter() - start)
    _cache[key] = entry
    if fast_key is not None and not entry.random:
        _cache[fast_key] = entry
    return _launch(call, entry) if fused else out


def _trace_now(call: _Call, entry: Entry) -> None:
    """Fused mode: the lowering traced at the op (its errors are the op's, as in strict
    mode) into the jaxpr its graphs evaluate, instead of tracing it in every graph. Not
    for a signature that has traced before (also in an earlier process): a warm start
    loads its graphs from disk and traces nothing."""
    if warm_start.traced_before(entry.digest):
        return
    args = [_aval(call.recs[i].value) for i in entry.order]
    dyn = list(call.dyn) + ([np.uint64(0), np.uint64(0)] if entry.random else [])
    try:
        entry.jaxpr = jaxpr_as_fun(jax.make_jaxpr(entry.trace)(*args, *dyn))
    except Exception as e:  # noqa: BLE001 - the lowering's errors become PyTorch's
        raise _runtime_error(call.spec, e) from e
    warm_start.note_traced(entry.digest)


def _aval(value):
    """A storage's value as make_jaxpr takes it: a pending one by its shape and dtype."""
    if type(value) is graph.Lazy:
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    return value


def _resize_and_run(call: _Call, entry: Entry):
    spec, values = call.spec, call.values
    for pos, shape in entry.resize:
        values[pos].resize_(shape)
    n = spec.n_positional
    return execute(spec, tuple(values[:n]),
                   {a.name: v for a, v in zip(spec.args[n:], values[n:])})


def _launch(call: _Call, entry: Entry):
    if entry.random:
        gen = next((v for a, v in zip(call.spec.args, call.values) if a.kind == GENERATOR),
                   None)
        seed, offset = _native.philox_next(gen, call.device, 1)
        call.dyn.append(np.uint64(seed))
        call.dyn.append(np.uint64(offset))
    return _run(call.spec, entry, call.recs, call.dyn, call.device, call.values, call)


def _run_strict(spec: OpSpec, entry: Entry, hit: tuple, args: tuple):
    """_run for a native cache hit in strict mode, calling the compiled program directly."""
    if graph.pending:
        graph.flush("strict op")
        hit = (*hit[:4], tuple(r.value for r in hit[1]))
    call = entry.call
    if call is None:
        return _run(spec, entry, hit[1], hit[2], hit[3], args)
    try:
        if hit[2]:
            results = call(*hit[4], *[_device_scalar(v, hit[3]) for v in hit[2]])
        else:
            results = call(*hit[4])
    except Exception as e:  # noqa: BLE001 - XLA runtime errors become PyTorch's
        raise _runtime_error(spec, e) from e
    if entry.checks is not None:
        checks.defer(results[-1], entry.checks, str(spec.op))
    if entry.single:
        shape, stride, dtype, jdtype, nbytes = entry.outs[0]
        return _new_tensor(shape, stride, dtype, jdtype, nbytes, hit[3], results[0])
    return _outputs(spec, entry, hit[1], hit[3], args, results)


def _run_fused(spec: OpSpec, entry: Entry, hit: tuple, args: tuple):
    """_run for a native cache hit in fused mode, of an op with other returns than one
    fresh tensor (kernel() records those through graph.record_single)."""
    device = hit[3]
    results = graph.record(entry, hit[1], hit[2], device, hit[4] if entry.ordered else None)
    out = _outputs(spec, entry, hit[1], device, args, results)
    if graph.due:
        graph.flush_due()
    return out


def _run(spec: OpSpec, entry: Entry, recs: list, dyn: list, device: int, values,
         call: _Call | None = None):
    """Launch (or, fused, record) a compiled op on the call's storages and run-time values;
    its fresh outputs become new tensors and written storages get their new buffers."""
    fused = modes.fused and not entry.alone
    if fused:
        results = graph.record(entry, recs, dyn, device)
    else:
        if graph.pending:
            graph.flush("strict op")
        if dyn:
            dyn = [_device_scalar(v, device) for v in dyn]
        try:
            results = entry.fn(recs, dyn)
        except Exception as e:  # noqa: BLE001 - XLA runtime errors become PyTorch's
            raise _runtime_error(spec, e) from e
        if entry.checks is not None:
            checks.defer(results[-1], entry.checks, str(spec.op))
        if modes.debug:
            debug.after_op(spec, call, results)
    new_tensor = table.new_tensor
    if entry.single:
        shape, stride, dtype, jdtype, nbytes = entry.outs[0]
        out = new_tensor(shape, stride, dtype, jdtype, nbytes, device, results[0])
        if fused and graph.flush_reason() is not None:
            graph.flush(graph.flush_reason())
        return out
    out = _outputs(spec, entry, recs, device, values, results)
    if fused:
        reason = graph.flush_reason()
        if reason is not None:
            graph.flush(reason)
    return out


def _outputs(spec: OpSpec, entry: Entry, recs: list, device: int, values, results):
    """The fresh outputs as new tensors, the written storages updated; the op's returns."""
    if entry.alias_return is not None:  # an in-place op: nothing new, its argument back
        for buf, value in zip(entry.written, results):
            recs[buf].set(value)
        return values[entry.alias_return]
    new_tensor = table.new_tensor
    fresh = []
    i = 0
    for out in entry.outs:
        if out is None:
            fresh.append(None)
        else:
            fresh.append(new_tensor(*out, device, results[i]))
            i += 1
    for buf in entry.written:
        recs[buf].set(results[i])
        i += 1
    return _returns(spec, entry, values, fresh)


_scalars: dict[tuple, Any] = {}
_PY_SCALARS = (float, int, bool, complex)


def _device_scalar(v, device: int):
    """A run-time Python number as a (weakly typed) device array, cached: passing the
    number itself makes every launch convert and copy it to the device."""
    if type(v) not in _PY_SCALARS:
        return v
    key = (type(v), v, device) if v == v and v != 0 else (type(v), repr(v), device)
    arr = _scalars.get(key)
    if arr is None:
        if len(_scalars) >= 4096:
            _scalars.clear()
        arr = _scalars[key] = jax.device_put(jnp.asarray(v), _device(device))
    return arr


def _factory_device(spec: OpSpec, values: list) -> int:
    for a, v in zip(spec.args, values):
        if a.name == "device" and v is not None:
            dev = torch.device(v)
            return dev.index if dev.index is not None else _native.current_device()
    return _native.current_device()


def _returns(spec: OpSpec, entry: Entry, values: list, fresh: list):
    plan = spec.returns_plan
    if not plan:
        return None
    fresh_iter = iter(fresh)
    out = []
    for step in plan:
        if step[0] == "alias":
            out.append(values[step[1]])
        elif step[0] == "list":
            out.append(list(fresh_iter))
        elif step[0] == "value":
            out.append(entry.values[step[1]])
        else:
            out.append(next(fresh_iter))
    return out[0] if len(out) == 1 else tuple(out)


def _runtime_error(spec: OpSpec, e: Exception) -> Exception:
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "Out of memory" in text:
        return torch.OutOfMemoryError(f"pjrt: out of device memory running {spec.op}: {text}")
    if type(e).__module__ == "builtins" and not isinstance(e, ExecutionError):
        # raised by the lowering itself (NotImplementedError, IndexError, ...): keep the type
        try:
            return type(e)(f"{spec.op}: {text}")
        except TypeError:
            pass
    return RuntimeError(f"pjrt: {spec.op} failed on the device: {text}")


# ---------------------------------------------------------------- compiling
def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.device.type != _PJRT:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_value(a: opspec.ArgSpec, v):
    if a.kind in (TENSOR, OPT_TENSOR):
        return None if v is None else _meta_tensor(v)
    if a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
        return [None if t is None else _meta_tensor(t) for t in v]
    if a.kind == GENERATOR:
        return None
    if isinstance(v, torch.device) and v.type == _PJRT:
        return torch.device("meta")
    return v


def _call(spec: OpSpec, values: list):
    pos, kw = [], {}
    for a, v in zip(spec.args, values):
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return spec.op(*pos, **kw)


def _run_meta(spec: OpSpec, values: list):
    """The op on meta tensors: PyTorch's checks and output metadata, without data."""
    metas = [_meta_value(a, v) for a, v in zip(spec.args, values)]
    try:
        return metas, _call(spec, metas)
    except Exception as meta_error:  # noqa: BLE001 - re-raised as the CPU's own error
        raise _cpu_error(spec, values) or meta_error from None


_CPU_ERROR_MAX_ELEMENTS = 1 << 20


def _cpu_error(spec: OpSpec, values: list) -> Exception | None:
    """The error CPU PyTorch gives for the same call (its messages are the familiar ones),
    found by running the op on CPU tensors of the same metadata; None if it does not fail."""

    def cpu(v):
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT:
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).zero_()
        if isinstance(v, list):
            return [cpu(x) for x in v]
        if isinstance(v, torch.device) and v.type == _PJRT:
            return torch.device("cpu")
        if isinstance(v, torch.Generator):
            return None
        return v

    total = sum(t.numel() for t in _flat_tensors(values) if t.device.type == _PJRT)
    if total > _CPU_ERROR_MAX_ELEMENTS:
        return None
    try:
        _call(spec, [cpu(v) for v in values])
    except Exception as e:  # noqa: BLE001
        return e
    return None


def _flat_tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat_tensors(item)]
    return []


def _compile(call: _Call, key: tuple) -> Entry:
    spec, values = call.spec, call.values
    metas, meta_out = _run_meta(spec, values)
    entry = Entry()

    # Out tensors PyTorch would resize: resize them, then run again.
    if spec.is_out:
        resize = [(pos, tuple(metas[pos].shape)) for pos in spec.mutated
                  if spec.args[pos].kind == TENSOR
                  and tuple(metas[pos].shape) != tuple(values[pos].shape)]
        if resize:
            entry.resize = resize
            return entry

    # The views the program writes: each tensor of each mutated arg, in order.
    for pos in spec.mutated:
        part = key[1 + pos]
        parts = part if spec.args[pos].kind in (TENSOR_LIST, OPT_TENSOR_LIST) else (part,)
        entry.targets.extend(p[:5] + p[8:9] for p in parts)
    entry.written = tuple(dict.fromkeys(t[0] for t in entry.targets))
    # Donate a written storage's old buffer when the new one can reuse it (same dtype).
    entry.donate = tuple(
        b for b in entry.written
        if call.recs[b].value is not None
        and all(dtypes.to_jax(t[1]) == call.recs[b].dtype for t in entry.targets if t[0] == b))

    # Fresh outputs, laid out as the meta result says (PyTorch's strides).
    fresh_meta = _fresh_outputs(spec, meta_out)
    if any(step[0] == "value" for step in spec.returns_plan):
        outs = meta_out if isinstance(meta_out, tuple) else (meta_out,)
        entry.values = {step[1]: outs[step[1]] for step in spec.returns_plan
                        if step[0] == "value"}
    for m in fresh_meta:
        if m is None:  # an undefined tensor (e.g. a gradient output_mask turned off)
            entry.outs.append(None)
            continue
        shape, stride, jdtype = tuple(m.shape), tuple(m.stride()), dtypes.to_jax(m.dtype)
        nbytes = table.storage_numel(shape, stride) * jdtype.itemsize
        entry.outs.append((shape, stride, m.dtype, jdtype, nbytes))
    if not entry.outs and len(spec.returns_plan) == 1 and spec.returns_plan[0][0] == "alias":
        entry.alias_return = spec.returns_plan[0][1]
    returns = spec.op._schema.returns
    entry.single = (not entry.written and len(returns) == 1 and returns[0].alias_info is None
                    and opspec._kind(returns[0].type) == TENSOR)

    first = _flat_tensors(meta_out)
    compute = apply.promotion(spec, metas, first[0].dtype if first else None)
    # What the lowering computes: the written tensors' values, else the fresh outputs.
    if spec.mutated:
        computed = [m for pos in spec.mutated for m in
                    (metas[pos] if isinstance(metas[pos], list) else [metas[pos]])]
    else:
        computed = fresh_meta
    trace = _make_trace(spec, key, entry, compute, computed)
    buffer_shapes = {p[0]: (p[5], p[6]) for p in _tensor_parts(spec, key)}
    sharding = jax.sharding.SingleDeviceSharding(_device(call.device))
    n_bufs = len(call.recs)
    order = list(entry.donate) + [i for i in range(n_bufs) if i not in entry.donate]
    entry.products = spec.lowering.products
    jitted = jax.jit(cpu_kernels.rewrite(trace, entry.products), out_shardings=sharding,
                     donate_argnums=tuple(range(len(entry.donate))))
    entry.digest = compile_cache.digest((key, call.device), call.device)
    entry.device = call.device
    entry.fn = _Launcher(jitted, None if order == list(range(n_bufs)) else order, entry)
    entry.trace = trace
    entry.order = order
    entry.ordered = order == list(range(n_bufs))
    entry.result_avals = [((o[4] // o[3].itemsize,), o[3]) for o in entry.outs if o is not None]
    for b in entry.written:
        numel, old = buffer_shapes[b]
        new = dtypes.to_jax([t for t in entry.targets if t[0] == b][-1][1])
        entry.result_avals.append(((numel * old.itemsize // new.itemsize,), new))
    entry.n_results = len(entry.result_avals)
    entry.name = str(spec.op)
    entry.random = spec.lowering.random
    entry.alone = not spec.lowering.eager
    entry.signature = _signature_text(spec, key)
    return entry


def _device(index: int):
    from ..runtime import client

    return client.device(index)


class _Launcher:
    """Calls a compiled op with its storage buffers (donated ones first) and run-time
    scalars; the first call compiles it (or loads it from the persistent cache)."""

    __slots__ = ("jitted", "order", "compiled", "name", "entry")

    def __init__(self, jitted, order: list[int] | None, entry: Entry):
        self.jitted = jitted
        self.order = order
        self.compiled = None
        self.entry = entry

    def __call__(self, recs: list, dyn: list):
        compiled = self.compiled
        if compiled is not None and self.order is None:  # the common case
            if dyn:
                return compiled(*[r.value for r in recs], *dyn)
            return compiled(*[r.value for r in recs])
        if self.order is None:
            args = [r.value for r in recs]
        else:
            args = [recs[i].value for i in self.order]
        return self.launch(args, dyn)

    def drop(self) -> None:
        """Let go of the program (compile_cache._hold): the next launch loads it again."""
        self.compiled = None
        self.entry.call = None

    def launch(self, args: list, dyn: list):
        """The program on the buffers already in its argument order (Entry.order)."""
        if self.compiled is None:
            entry = self.entry
            self.compiled = compile_cache.compile(
                self.jitted, (*args, *dyn), entry.digest, entry.device,
                get_side=lambda: entry.checks, set_side=entry.set_checks, drop=self.drop)
            if self.order is None:
                entry.call = self.compiled
        return self.compiled(*args, *dyn)


def _fresh_outputs(spec: OpSpec, meta_out) -> list[torch.Tensor]:
    """The meta tensors of the returns that are new tensors (not aliases of inputs)."""
    returns = spec.op._schema.returns
    outs = meta_out if len(returns) > 1 else (meta_out,)
    fresh = []
    for r, m in zip(returns, outs):
        if r.alias_info is None:
            fresh.extend(_flat_tensors(m) if m is not None else [None])
    return fresh


def _signature_text(spec: OpSpec, key: tuple) -> str:
    """'aten.add.Tensor(float32[8, 3], float32[3])': what a recompile message shows."""
    args = []
    for p in _tensor_parts(spec, key):
        args.append(f"{str(p[1]).removeprefix('torch.')}{list(p[2])}")
    return f"{spec.op}({', '.join(args)})"


def _tensor_parts(spec: OpSpec, key: tuple):
    """Every pjrt tensor part of a key, in argument order."""
    for a, part in zip(spec.args, key[1:]):
        if a.kind in (TENSOR, OPT_TENSOR):
            parts = (part,)
        elif a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
            parts = part
        else:
            continue
        for p in parts:
            if p is not None and isinstance(p[0], int):
                yield p


def _make_trace(spec: OpSpec, key: tuple, entry: Entry, compute, computed):
    """The function jax.jit traces for one signature of one op."""
    lowering = spec.lowering
    arg_parts = key[1:]
    buffer_shapes = {p[0]: (p[5], p[6]) for p in _tensor_parts(spec, key)}
    meta_structs = [None if m is None else
                    jax.ShapeDtypeStruct(tuple(m.shape), dtypes.to_jax(m.dtype))
                    for m in computed]
    out_specs = [None if o is None else o[:2] + o[3:4] for o in entry.outs]
    n_targets = len(entry.targets)

    n_bufs = len(buffer_shapes)
    order = list(entry.donate) + [i for i in range(n_bufs) if i not in entry.donate]
    flat_math = _shape_agnostic(spec, key)
    if flat_math:  # what a lowering sees of its outputs: 1-D too
        meta_structs = [m if m is None or len(m.shape) < 2 else
                        jax.ShapeDtypeStruct((math.prod(m.shape),), m.dtype)
                        for m in meta_structs]

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

        def read(part):
            if part is None:
                return None
            if part[0] == "cpu0":
                return jnp.asarray(next(dyn_iter), dtypes.to_jax(part[1]))
            if part[0] == "num":
                return next(dyn_iter)
            idx, dtype, shape, stride, offset = part[:5]
            if flat_math and len(shape) > 1:  # see _shape_agnostic
                shape, stride = (math.prod(shape),), (1,)
            return _resolve_flags(views.read(bufs[idx], shape, stride, offset,
                                             dtypes.to_jax(dtype)), part[8])

        values = []
        for a, part in zip(spec.args, arg_parts):
            kind = a.kind
            if kind == GENERATOR or (spec.is_out and a.write):
                values.append(None)
            elif kind in (TENSOR, OPT_TENSOR):
                values.append(read(part))
            elif kind in (TENSOR_LIST, OPT_TENSOR_LIST):
                values.append([read(p) for p in part])
            elif kind == SCALAR:  # a static Python number, or a run-time value
                values.append(part[1] if isinstance(part, tuple) else next(dyn_iter))
            elif kind == SCALAR_LIST:
                values.append([next(dyn_iter) for _ in part[1]])
            else:
                values.append(_unhashable(part))
        rng = None
        if lowering.random:
            seed, offset = next(dyn_iter), next(dyn_iter)
            rng = jax.random.fold_in(jax.random.key(seed), offset)
        with checks.CheckCollector() as collected:
            results = apply.invoke(spec, values, compute, meta_structs, rng)
        entry.checks = [(err, msg) for _, err, msg in collected.checks] or None

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
        new_bufs = {}
        for (buf, dtype, shape, stride, offset, view_flags), val in zip(entry.targets,
                                                                         target_vals):
            val = _resolve_flags(apply.broadcast_cast(val, shape, dtypes.to_jax(dtype)),
                                 view_flags)  # an involution: stored as the view reads it
            new_bufs[buf] = views.write(new_bufs.get(buf, bufs[buf]), val, shape, stride, offset)
        flags = (jnp.stack([bad for bad, _, _ in collected.checks]),) if entry.checks else ()
        return tuple(outs) + tuple(new_bufs[b] for b in entry.written) + flags

    return trace


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
    for a, part in zip(spec.args, key[1:]):
        if a.kind in (TENSOR, OPT_TENSOR):
            parts = [(0, part)]
        elif a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
            parts = list(enumerate(part))
        else:
            continue
        for position, p in parts:
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


def _unhashable(v):
    if isinstance(v, tuple) and v[:1] == ("device",):
        return torch.device(v[1])
    if isinstance(v, tuple):
        return [_unhashable(x) for x in v]
    return v


def _layout(value, shape, stride, dtype):
    """A result in PyTorch's output layout. None where the meta kernel says a tensor is
    returned means an undefined gradient: zeros, as PyTorch materializes them."""
    if value is None:
        value = jnp.zeros(shape, dtype)
    value = apply.broadcast_cast(value, shape, dtype)
    n = math.prod(shape)
    if table.storage_numel(shape, stride) == n:
        return views.to_flat(value, stride)
    flat = jnp.zeros((table.storage_numel(shape, stride),), dtype)
    return views.write(flat, value, shape, stride, 0)
