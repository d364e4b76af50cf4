"""Running a cached op: launched (strict, debug) or recorded into the pending graph
(fused), its fresh outputs made into new tensors and its written storages given their
new buffers."""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..lowering import checks
from ..runtime import device_trace, sites, watch
from ..storage import table
from . import debug, graph, modes
from .call_key import Call
from .errors import runtime_error
from .op_cache import Entry
from .opspec import GENERATOR, OpSpec
from .scalars import device_scalar

_new_tensor = table.new_tensor


def launch(call: Call, entry: Entry):
    """Run a cached entry for a call keyed in Python (a random op draws its RNG key here)."""
    if entry.random:
        gen = next((v for a, v in zip(call.spec.args, call.values) if a.kind == GENERATOR),
                   None)
        seed, offset = runtime.shim().philox_next(gen, call.device, 1)
        call.dyn.append(np.uint64(seed))
        call.dyn.append(np.uint64(offset))
    return run(call.spec, entry, call.recs, call.dyn, call.device, call.values, call)


def run_strict(spec: OpSpec, entry: Entry, hit: tuple, args: tuple):
    """run() for a native cache hit in strict mode, calling the compiled program directly."""
    if graph.pending:
        graph.flush("strict op")
        hit = (*hit[:4], tuple(r.value for r in hit[1]))
    call = entry.call
    if call is None or watch.profiling:
        return run(spec, entry, hit[1], hit[2], hit[3], args)
    try:
        if hit[2]:
            results = call(*hit[4], *[device_scalar(v, hit[3]) for v in hit[2]])
        else:
            results = call(*hit[4])
    except Exception as e:  # noqa: BLE001 - XLA runtime errors become PyTorch's
        raise runtime_error(spec, e) from e
    if entry.checks is not None:
        checks.defer(results[-1], entry.checks, str(spec.op))
    if entry.single:
        return _new_tensor(*entry.outs[0], hit[3], results[0])
    return outputs(spec, entry, hit[1], hit[3], args, results)


def run_fused(spec: OpSpec, entry: Entry, hit: tuple, args: tuple):
    """run() for a native cache hit in fused mode, of an op with other returns than one
    fresh tensor (executor.native_call records those through graph.record_single)."""
    device = hit[3]
    results = graph.record(entry, hit[1], hit[2], device, hit[4] if entry.ordered else None)
    out = outputs(spec, entry, hit[1], device, args, results)
    if graph.due:
        graph.flush_due()
    return out


def run(spec: OpSpec, entry: Entry, recs: list, dyn: list, device: int, values,
        call: Call | None = None):
    """Launch (or, fused, record) a compiled op on the call's storages and run-time values;
    its fresh outputs become new tensors and written storages get their new buffers."""
    fused = modes.fused and not entry.alone
    if fused:
        results = graph.record(entry, recs, dyn, device)
    else:
        if graph.pending:
            graph.flush("strict op")
        if dyn:
            dyn = [device_scalar(v, device) for v in dyn]
        try:
            if watch.profiling:
                results = _traced(entry, recs, dyn, device)
            else:
                results = entry.fn(recs, dyn)
        except Exception as e:  # noqa: BLE001 - XLA runtime errors become PyTorch's
            raise runtime_error(spec, e) from e
        if entry.checks is not None:
            checks.defer(results[-1], entry.checks, str(spec.op))
    if entry.single:
        out = _new_tensor(*entry.outs[0], device, results[0])
    else:
        out = outputs(spec, entry, recs, device, values, results)
    if not fused and modes.debug:
        # after the written storages took their new buffers: the old ones were donated, and
        # a check that raises here must not leave a tensor on a deleted buffer
        debug.after_op(spec, call, results)
    if fused:
        reason = graph.flush_reason()
        if reason is not None:
            graph.flush(reason)
    return out


def _traced(entry: Entry, recs: list, dyn: list, device: int):
    """entry.fn(recs, dyn) as a program run of the profile recording: a strict op with the
    line of user code it was called at, or a torch.compile graph with its nodes."""
    ops = None if entry.alone else [(entry.name, sites.user_site())]
    return device_trace.launch(entry.fn, entry.digest, device, [recs, dyn],
                               [recs[b].value for b in entry.donate], ops)


def outputs(spec: OpSpec, entry: Entry, recs: list, device: int, values, results):
    """The fresh outputs as new tensors, the written storages updated; the op's returns."""
    if entry.alias_return is not None:  # an in-place op: nothing new, its argument back
        for buf, value in zip(entry.written, results):
            recs[buf].set(value)
        return values[entry.alias_return]
    fresh = []
    i = 0
    for out in entry.outs:
        if out is None:
            fresh.append(None)
        else:
            fresh.append(_new_tensor(*out, device, results[i]))
            i += 1
    for buf in entry.written:
        recs[buf].set(results[i])
        i += 1
    return _returns(spec, entry, values, fresh)


def _returns(spec: OpSpec, entry: Entry, values: list, fresh: list):
    """What the op returns, in its schema's order: its arguments, new tensors, values."""
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
