"""Exact ops of a graph run op by op, computed on the host where they have no program yet.

A fused graph whose program is not compiled runs op by op (eager/tiers.py), and each op
without a program of its own compiles one first: 20-80 ms of XLA for a concatenation. A
decode loop whose KV cache or attention mask grows by a token a step meets a new length
at every step, so those programs serve one call each. Where an op's traced lowering (its
jaxpr) is made only of steps whose result does not depend on who computes it (moving
data: reshapes, slices, concatenations, broadcasts, transposes, selects; integer and
boolean arithmetic and comparisons, which wrap and compare the same everywhere; float to
integer conversions of values the type holds), NumPy evaluates it on the host in well
under a millisecond, bit for bit what the program would compute. Float arithmetic and
comparisons are never run here (rounding, denormals flushed to zero, fused multiply-adds
and reductions' order belong to the compiler); float data is only moved.

The rule (tiers.run_ops): an op runs here while (a) no program for it is compiled or on
disk, (b) every step of its jaxpr is exact, (c) its operands and results hold at most
MAX_BYTES, (d) it has been wanted in one flush only, and (e) its runs here have taken
less than BUDGET seconds, about what compiling its program would: an op wanted in a later
flush, or again and again within one (a loop's steps run op by op while their fused
program compiles), recurs and gets its program as before. A new length of a growing cache
is wanted by one step's layers and never again.

The jaxpr is flattened into a host program (program(): its steps as plain data, calls
inlined), kept in the compile cache's `host` note (runtime/warm_start.HOST) with the
verdict for inexact ops: a warm process, which traces no op where fused mode records it,
reads it there instead of tracing the lowering (about 1 ms an op).
"""

from __future__ import annotations

import base64
import pickle
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from .. import counters
from ..runtime import client, compile_cache, device_trace, warm_start, watch

MAX_BYTES = 1 << 20  # operands and results together: transfers stay cheap on any device
# Seconds an op may spend on the host (its runs wait for their operands, and transfer
# them: 0.1-3 ms each) before it gets its program: a quarter of a quick compile's lowering
# and compile (eager/tiers.py's OP_LOWER + OP_COMPILE, 40 ms on XLA:CPU), since each run
# also lets the device's queue run dry while the host waits, which its time does not show
# (a static-cache decode loop ran 3-5% slower with 40 ms: 471 runs on the host).
BUDGET = 0.01

_INT_KINDS = "iub"  # signed, unsigned, bool: integer conversions
_ARITHMETIC = "iu"  # wrapping arithmetic (NumPy refuses some of it on bool)


def _ints(*avals, kinds: str = _INT_KINDS) -> bool:
    return all(np.dtype(a.dtype).kind in kinds for a in avals)


def _same(x):
    return x


def _select_n(which, *cases):
    if np.dtype(which.dtype) == np.bool_:
        which = which.astype(np.int32)
    return np.choose(which, cases) if cases[0].ndim or which.ndim else cases[int(which)]


def _iota(*, dtype, shape, dimension, **_):
    n = shape[dimension]
    r = np.arange(n, dtype=dtype).reshape([n if i == dimension else 1 for i in
                                          range(len(shape))])
    return np.broadcast_to(r, shape)


def _broadcast_in_dim(x, *, shape, broadcast_dimensions, **_):
    expanded = np.reshape(x, [x.shape[broadcast_dimensions.index(i)]
                              if i in broadcast_dimensions else 1 for i in range(len(shape))])
    return np.broadcast_to(expanded, shape)


def _slice(x, *, start_indices, limit_indices, strides):
    steps = strides or (1,) * x.ndim
    return x[tuple(slice(s, e, t) for s, e, t in zip(start_indices, limit_indices, steps))]


def _clamped_starts(x_shape, sizes, starts) -> list[int]:
    """XLA's dynamic slices move their start indices into bounds."""
    return [min(max(int(s), 0), d - n) for s, d, n in zip(starts, x_shape, sizes)]


def _dynamic_slice(x, *starts, slice_sizes):
    begin = _clamped_starts(x.shape, slice_sizes, starts)
    return x[tuple(slice(b, b + n) for b, n in zip(begin, slice_sizes))]


def _dynamic_update_slice(x, update, *starts):
    begin = _clamped_starts(x.shape, update.shape, starts)
    out = np.array(x, copy=True)
    out[tuple(slice(b, b + n) for b, n in zip(begin, update.shape))] = update
    return out


def _pad(x, value, *, padding_config):
    """lax.pad: `interior` values between elements, then `low`/`high` at the ends (a
    negative one cuts)."""
    for axis, (low, high, interior) in enumerate(padding_config):
        low, high, interior = int(low), int(high), int(interior)
        if interior and x.shape[axis] > 1:
            n = x.shape[axis]
            shape = list(x.shape)
            shape[axis] = n + (n - 1) * interior
            spread = np.full(shape, value, dtype=x.dtype)
            index = [slice(None)] * x.ndim
            index[axis] = slice(None, None, interior + 1)
            spread[tuple(index)] = x
            x = spread
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(low, 0), max(high, 0))
        x = np.pad(x, widths, constant_values=value)
        cut = [slice(None)] * x.ndim
        cut[axis] = slice(max(-low, 0), x.shape[axis] - max(-high, 0))
        x = x[tuple(cut)]
    return x


def _squeeze(x, *, dimensions):
    return np.squeeze(x, axis=tuple(dimensions)) if dimensions else x


class NotExact(Exception):
    """A float converted to an integer type that cannot hold it (NaN, infinite, out of
    range): C leaves the result undefined and XLA saturates; or an integer converted to a
    float that cannot hold it exactly (its rounding is the compiler's): the program
    computes it."""


def _convert(x, *, new_dtype, **_):
    dst = np.dtype(new_dtype)
    if x.dtype.kind == "f" and dst.kind in "iu":
        info = np.iinfo(dst)
        if not (np.isfinite(x).all() and (x > info.min - 1).all() and (x < info.max + 1).all()):
            raise NotExact(f"{x.dtype} to {dst}")
    elif x.dtype.kind in _INT_KINDS and jnp.issubdtype(dst, jnp.floating):
        held = 1 << (jnp.finfo(dst).nmant + 1)  # every integer up to this, exactly
        if not ((x >= -held).all() and (x <= held).all()):
            raise NotExact(f"{x.dtype} to {dst}")
    return x.astype(dst)


def _exact_convert(eqn) -> bool:
    """Integer to integer (both wrap), float to integer (both truncate a value the type
    holds), integer or bool to float (both give the value itself where the float holds it:
    a pad or fill value of 0); _convert checks the values as it runs, NotExact otherwise."""
    src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.params["new_dtype"])
    return src == dst or (src.kind in _INT_KINDS and dst.kind in _INT_KINDS) or (
        src.kind == "f" and dst.kind in "iu") or (
        src.kind in _INT_KINDS and jnp.issubdtype(dst, jnp.floating))  # (bfloat16's kind: V)


def _clamp(lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi)


def _cumsum(x, *, axis, reverse):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)
    return np.cumsum(x, axis=axis, dtype=x.dtype)


def _reduce(f):
    return lambda x, *, axes, **_: f(x, axis=tuple(axes))


def _arg(f):
    def arg(x, *, axes, index_dtype):
        return f(x, axis=axes[0]).astype(index_dtype)  # (the first of equal values, as XLA)
    return arg


def _elementwise(f):
    """An elementwise step: its parameters (an accumulation dtype) are checked by _exact."""
    return lambda *xs, **_: f(*xs)


# primitive -> (NumPy evaluation, when the step is exact: None for always)
_ALWAYS = None
_STEPS: dict[str, tuple[Any, Any]] = {
    "reshape": (lambda x, *, new_sizes, **_: np.reshape(x, new_sizes),
                lambda eqn: eqn.params.get("dimensions") is None),
    "squeeze": (_squeeze, _ALWAYS),
    "broadcast_in_dim": (_broadcast_in_dim, _ALWAYS),
    "transpose": (lambda x, *, permutation: np.transpose(x, permutation), _ALWAYS),
    "slice": (_slice, _ALWAYS),
    "dynamic_slice": (_dynamic_slice, _ALWAYS),
    "dynamic_update_slice": (_dynamic_update_slice, _ALWAYS),
    "concatenate": (lambda *xs, dimension: np.concatenate(xs, axis=dimension), _ALWAYS),
    "pad": (_pad, _ALWAYS),
    "cumsum": (_cumsum, "arithmetic"),
    "reduce_sum": (_reduce(np.sum), "arithmetic"),
    "reduce_max": (_reduce(np.max), "ints"), "reduce_min": (_reduce(np.min), "ints"),
    "reduce_or": (_reduce(np.bitwise_or.reduce), "ints"),
    "reduce_and": (_reduce(np.bitwise_and.reduce), "ints"),
    "argmax": (_arg(np.argmax), "ints"), "argmin": (_arg(np.argmin), "ints"),
    "rev": (lambda x, *, dimensions: np.flip(x, axis=tuple(dimensions)), _ALWAYS),
    "select_n": (_select_n, _ALWAYS),
    "iota": (_iota, lambda eqn: _ints(*[v.aval for v in eqn.outvars])),
    "copy": (_same, _ALWAYS),
    "copy_p": (_same, _ALWAYS),
    "convert_element_type": (_convert, _exact_convert),
    # (integer comparisons only: XLA:CPU treats float denormals as zero, and rewrites a
    # float comparison selecting its own operands into max/min)
    **{name: (_elementwise(f), "ints") for name, f in (
        ("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
        ("gt", np.greater), ("ge", np.greater_equal))},
    **{name: (_elementwise(f), "arithmetic") for name, f in (
        ("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("neg", np.negative))},
    **{name: (_elementwise(f), "ints") for name, f in (
        ("max", np.maximum), ("min", np.minimum), ("clamp", _clamp),
        ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
        ("not", np.invert))},
}


_CALLS = ("pjit", "jit", "closed_call")  # steps that call an inner jaxpr


def _inner(eqn):
    """A call step's inner jaxpr and its constants (None, [] where it has none)."""
    inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    return getattr(inner, "jaxpr", inner), getattr(inner, "consts", [])


def _exact(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _CALLS:
            inner, _ = _inner(eqn)
            if inner is None or not _exact(inner):
                return False
            continue
        step = _STEPS.get(name)
        if step is None:
            return False
        when = step[1]
        if name.startswith(("reduce_", "arg")) and not np.prod(eqn.invars[0].aval.shape):
            return False  # (NumPy refuses an empty max)
        out_dtype = eqn.params.get("out_dtype")
        if out_dtype is not None and any(np.dtype(out_dtype) != np.dtype(v.aval.dtype)
                                         for v in eqn.invars):
            return False  # computed in a wider type than its operands
        if when in ("ints", "arithmetic"):
            kinds = _INT_KINDS if when == "ints" else _ARITHMETIC
            if not _ints(*[v.aval for v in eqn.invars], *[v.aval for v in eqn.outvars],
                         kinds=kinds):
                return False
        elif when is not None and not when(eqn):
            return False
    return True


def program(closed) -> tuple | None:
    """The host program of an op's traced lowering (a ClosedJaxpr), None where a step of it
    is not exact: its steps in order, calls inlined, as plain data (primitive names,
    parameters, slots), which warm_start.HOST keeps for the next process (pickled)."""
    if not _exact(closed.jaxpr):
        return None
    steps: list = []
    consts: list = []
    slots = [len(closed.jaxpr.invars)]  # the next free slot

    def ref(v, env):
        return (v.val,) if isinstance(v, jcore.Literal) else env[v]

    def flatten(jaxpr, jaxpr_consts: list, env: dict) -> list:
        """Append jaxpr's steps (env: its inputs' slots); its outputs' slots."""
        for var, val in zip(jaxpr.constvars, jaxpr_consts):
            env[var] = slots[0]
            consts.append((slots[0], np.asarray(val)))
            slots[0] += 1
        for eqn in jaxpr.eqns:
            ins = [(ref(v, env), np.dtype(v.aval.dtype)) for v in eqn.invars]
            name = eqn.primitive.name
            if name in _CALLS:
                inner, inner_consts = _inner(eqn)
                inner_env = dict(zip(inner.invars, (r for r, _ in ins)))
                for var, r in zip(eqn.outvars, flatten(inner, inner_consts, inner_env)):
                    env[var] = r
                continue
            params = {k: v for k, v in eqn.params.items() if "sharding" not in k}
            outs = []
            for var in eqn.outvars:
                env[var] = slots[0]
                outs.append((slots[0], np.dtype(var.aval.dtype)))
                slots[0] += 1
            steps.append((name, params, tuple(ins), tuple(outs),
                          eqn.primitive.multiple_results))
        return [ref(v, env) for v in jaxpr.outvars]

    env = {var: i for i, var in enumerate(closed.jaxpr.invars)}
    results = flatten(closed.jaxpr, closed.consts, env)
    return (slots[0], tuple(np.dtype(v.aval.dtype) for v in closed.jaxpr.invars),
            tuple(consts), tuple(steps),
            tuple(zip(results, (np.dtype(v.aval.dtype) for v in closed.jaxpr.outvars))))


def evaluate(prog: tuple, args: list) -> list:
    """A host program's results (NumPy arrays) for its operands; NotExact where a value
    makes a step inexact."""
    n_slots, in_dtypes, consts, steps, results = prog
    env: list = [None] * n_slots
    for i, (val, dtype) in enumerate(zip(args, in_dtypes)):
        env[i] = np.asarray(val, dtype=dtype)
    for slot, val in consts:
        env[slot] = val

    def read(r, dtype):
        return np.asarray(r[0] if type(r) is tuple else env[r], dtype=dtype)

    for name, params, ins, outs, multiple in steps:
        vals = _STEPS[name][0](*[read(r, dtype) for r, dtype in ins], **params)
        for (slot, dtype), val in zip(outs, vals if multiple else [vals]):
            # results in the step's own dtype (NumPy widens mixed operands; integer
            # arithmetic wraps alike in either width)
            env[slot] = np.asarray(val).astype(dtype, copy=False)
    return [read(r, dtype) for r, dtype in results]


def _stored(entry) -> tuple | bool | None:
    """What an earlier process learnt of the entry's lowering on the host (warm_start.HOST):
    its program, False (not exact), None (nothing, or a record that does not load)."""
    text = warm_start.HOST.get(entry.digest)
    if text is None:
        return None
    if text == b"-":
        return False
    try:
        prog = pickle.loads(base64.b64decode(text))
        if all(step[0] in _STEPS for step in prog[3]):
            return prog
    except Exception:  # noqa: BLE001 - a damaged record: traced again
        pass
    return None


def _note(entry, prog: tuple | None) -> None:
    try:
        text = b"-" if prog is None else base64.b64encode(
            pickle.dumps(prog, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - (a parameter that does not pickle: not kept)
        return
    warm_start.HOST.note(entry.digest, text)


def plan(entry, launcher, args: list, values: list, epoch: int):
    """The op's jaxpr where it runs on the host in this flush (module docstring), else
    None. `args` are its storage buffers (arrays, or ShapeDtypeStructs of values an
    earlier op of the graph computes), `values` its run-time scalars."""
    host = entry.host
    if host is False or (entry.host_epoch is not None and not wanted(entry, epoch)):
        return None
    if host is None:
        if compile_cache.stored(launcher.digest) or entry.trace is None:
            entry.host = False
            return None
        nbytes = sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize for a in args
                     if a is not None)
        nbytes += sum(np.prod(shape) * np.dtype(dtype).itemsize
                      for shape, dtype in entry.result_avals)
        if nbytes > MAX_BYTES or entry.random:
            entry.host = False
            return None
        entry.host = _lowered(entry, args, values)
        if entry.host is False:
            return None
    entry.host_epoch = epoch
    return entry.host


def _lowered(entry, args: list, values: list) -> tuple | bool:
    """The entry's host program, or False: from its jaxpr (traced where fused mode recorded
    the op), else from an earlier process's record (a warm start traces nothing where it
    records), else traced now (and recorded)."""
    closed = entry.closed
    if closed is None:
        stored = _stored(entry)
        if stored is not None:
            counters.count("host_records_used")
            return stored
        try:
            closed = jax.make_jaxpr(entry.trace)(*[None if a is None else
                                                   jax.ShapeDtypeStruct(a.shape, a.dtype)
                                                   for a in args], *values)
        except Exception:  # noqa: BLE001 - then it compiles, as it always did
            return False
    prog = program(closed)
    _note(entry, prog)
    return False if prog is None else prog


def wanted(entry, epoch: int) -> bool:
    """Whether the op, planned for the host in this flush (plan), runs there again."""
    return entry.host_epoch == epoch and entry.host_seconds < BUDGET and bool(entry.host)


def try_run(entry, epoch: int, args: list, values: list, device: int) -> list | None:
    """The op's results computed on the host where plan() chose that for this flush and
    its budget lasts; None where it runs its program instead (from now on, where a value
    made a step inexact)."""
    if not wanted(entry, epoch):
        return None
    try:
        return run(entry, args, values, device)
    except NotExact:
        entry.host = False
        return None


def run(entry, args: list, values: list, device: int) -> list:
    """The op's results as device buffers, computed by NumPy from its operands; NotExact
    where a value makes a step inexact."""
    start = time.perf_counter()
    traced = device_trace.now() if watch.profiling else None
    flat = jax.tree.leaves((list(args), list(values)))
    with np.errstate(all="ignore"):
        outs = evaluate(entry.host, [np.asarray(a) for a in flat])
    counters.count("host_ops")
    target = client.device(device)
    res = [jax.device_put(np.ascontiguousarray(o), target, may_alias=False) for o in outs]
    entry.host_seconds += time.perf_counter() - start
    if traced is not None:  # (a profile shows it on the host's row, with its op)
        device_trace.host(f"pjrt host op: {entry.name}", traced, {"op": entry.signature})
    return res
