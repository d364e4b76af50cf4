"""The op executor's entry: one cached XLA executable per (op, input signature, static
args), for every call of a lowered op on pjrt tensors.

For each call the executor builds a key from the op and its arguments (call_key.py:
storage buffer, dtype, shape, stride and offset of every tensor; static arguments by
value; Python scalars by type only, passed at run time). On a miss (op_cache.py) it
runs the op on meta tensors (meta.py: PyTorch's own shape and dtype checks, and the
output layout), traces the lowering into one jitted program that reads the input
views, computes, lays the outputs out with PyTorch's strides and writes mutated views
back into their storages (trace.py), and caches it. A hit costs the key, a dictionary
lookup and one launch (launch.py: strict, fused or debug, and the returned tensors).

Calls are keyed natively first: the PrivateUse1 kernel of every lowered op is
C++ (runtime/native/op_kernel.cpp), which packs the same metadata into a key of
its own, under which the entry is filed too the first time the Python key finds
it. On a fused hit of an op that returns one fresh tensor, or the one argument
it writes in place, it records the op itself; every other call comes here
through native_call. Calls made from Python (kernel()) are keyed natively by
the same code (lookup).
"""

from __future__ import annotations

import time

from .. import counters
from ..storage import table
from . import graph, modes, opspec
from .call_key import Call, factory_device, key_of
from .launch import launch, run_fused, run_strict
from .op_cache import Entry, cache_size, compile_entry
from .op_cache import cache as _cache
from .opspec import OpSpec
from .trace import trace_now

__all__ = ["cache_size", "execute", "install", "kernel", "native_call"]

_records = table._records
_record_single = graph.record_single
_native = None  # set by install()
_PJRT = None  # the torch device type name, set by install()


def install(native, device_type: str) -> None:
    """Hand the native op kernel what it reads and calls (runtime/native/op_kernel.cpp)."""
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
            return run_fused(spec, entry, hit, args)
        out = _record_single(entry, hit[1], hit[2], hit[3], hit[4] if entry.ordered else None)
        if graph.due:
            graph.flush_due()
        return out
    return run_strict(spec, entry, hit, args)


def execute(spec: OpSpec, args: tuple, kwargs: dict):
    """kernel(), with the op's arguments as a tuple and a dict."""
    return kernel(spec, *args, **kwargs)


def _execute(spec: OpSpec, args: tuple, kwargs: dict, fast_key: tuple | None):
    """The Python key: every call the native key does not cover, and the first of each
    signature (`fast_key`: the native key to file the entry under as well)."""
    values = opspec.normalize(spec, args, kwargs)
    call = Call(spec, values)
    key = key_of(call)
    if call.device is None:  # a factory: the device comes from its arguments
        call.device = factory_device(spec, values)
    key = (key, call.device)  # programs are compiled for one device
    entry = _cache.get(key)
    if entry is None:
        return _execute_miss(call, key, fast_key)
    _counts["cache_hits"] += 1
    if entry.resize is not None:
        return _resize_and_run(call, entry)
    if fast_key is not None and not entry.random and not call.offsets_keyed:
        _cache[fast_key] = entry
    return launch(call, entry)


def _execute_miss(call: Call, key: tuple, fast_key: tuple | None = None):
    """A new signature: compiled; cached once it has traced (an op whose lowering fails
    stays uncached, so that every call of it raises, in every mode)."""
    counters.count("cache_misses")
    entry = compile_entry(call, key[0])
    if entry.resize is not None:
        _cache[key] = entry
        return _resize_and_run(call, entry)
    fused = modes.fused and not entry.alone
    if fused:  # compiled as part of its graph; traced now, so that errors raise here
        trace_now(call, entry)
    else:
        counters.count("compiles")
        start = time.perf_counter()
        try:
            out = launch(call, entry)
        finally:
            counters.add_compile_time(time.perf_counter() - start)
    _cache[key] = entry
    # (a call whose views share a written storage at run-time offsets stays on the Python
    # key, which tells overlapping views from others: call_key.shared_offsets)
    if fast_key is not None and not entry.random and not call.offsets_keyed:
        _cache[fast_key] = entry
    return launch(call, entry) if fused else out


def _resize_and_run(call: Call, entry: Entry):
    """An out= call whose outputs PyTorch would resize: resized, then called again."""
    spec, values = call.spec, call.values
    for pos, shape, stride in entry.resize:
        values[pos].resize_(shape)
        if values[pos].stride() != stride:
            values[pos].as_strided_(shape, stride)
    n = spec.n_positional
    return execute(spec, tuple(values[:n]),
                   {a.name: v for a, v in zip(spec.args[n:], values[n:])})
