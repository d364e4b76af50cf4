"""The op cache: one compiled Entry per call signature, built on a miss from the meta
kernel's output layout and the traced lowering, and its launcher, which compiles (or
loads from the persistent cache) on first use."""

from __future__ import annotations

import functools
from typing import Any

import jax
import torch

from .. import counters
from ..lowering import apply
from ..runtime import client, compile_cache, cpu_kernels, warm_start, watch
from ..storage import dtypes, views
from . import meta_record, opspec, recompiles, trace
from .call_key import Call, program_key, signature_text, tensor_parts
from .meta import check_arguments, cpu_check, flat_tensors, fresh_outputs, run_meta
from .opspec import OPT_TENSOR_LIST, TENSOR, TENSOR_LIST


class Entry:
    """A compiled op for one input signature."""

    __slots__ = ("fn", "trace", "order", "n_results", "result_avals", "outs", "single",
                 "targets", "target_slots", "written", "donate", "resize", "checks", "checked",
                 "name",
                 "digest", "device", "signature", "values", "random", "call", "ordered",
                 "alias_return", "products", "jaxpr", "closed", "alone", "quick", "draws", "host",
                 "host_epoch", "host_seconds")

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
        self.draws = False  # and draws random bits with it (not SDPA without dropout)
        self.products = False  # the lowering computes matrix products (cpu_kernels)
        # (shape, stride, torch dtype, jax dtype, storage bytes) of each fresh output
        self.outs: list[tuple] = []
        self.single = False  # the op returns exactly one fresh tensor
        self.alias_return: int | None = None  # the op returns only this argument (in place)
        # (buf, dtype, shape, stride, offset, view flags) of each written view
        self.targets: list[tuple] = []
        self.target_slots: list[tuple[int, int]] = []  # each target's (argument, index)
        self.written: tuple[int, ...] = ()  # storage buffers the program returns, in order
        self.donate: tuple[int, ...] = ()  # written buffers whose old value is donated
        self.resize: list[tuple[int, tuple]] | None = None  # out= tensors to resize first
        self.checks: list[tuple] | None = None  # (error, message, op, kinds) of device checks
        # Its program checks data, known before it is traced or loaded (warm_start's note):
        # fused eager keeps such an op where nothing reads its result.
        self.checked = False
        # What fused graphs evaluate: the traced lowering as a function of its flat
        # inputs (set where fused mode first records the signature; else they trace).
        self.jaxpr = None
        self.closed = None  # that jaxpr itself (eager/host_ops.py evaluates it)
        # Runs as its own program in fused mode too: a torch.compile graph, already one
        # XLA program, cached and loaded apart from the eager code around it.
        self.alone = False
        # The same program compiled quickly (compile_cache.quick_options), for fused
        # graphs run op by op until their program is compiled (eager/tiers.py).
        self.quick: _Launcher | None = None
        # Graphs run op by op compute it on the host where it is exact (eager/host_ops.py):
        # its jaxpr there, False where it may not, None until asked; the flush it ran in,
        # and the seconds its runs there took.
        self.host = None
        self.host_epoch: int | None = None
        self.host_seconds = 0.0

    def set_checks(self, checks: list | None) -> None:
        """Device-side checks of a program loaded from disk (tracing would have found them)."""
        self.checks = checks
        self.checked = checks is not None


cache: dict[tuple, Entry] = {}
# torch's default dtype when the cached programs were built: it sets the result dtype of
# some calls whose key does not name it (an integer tensor divided, a float scalar
# promoted, a factory without a dtype), so a change of it drops them
_default_dtype = torch.get_default_dtype()


def default_dtype_changed() -> None:
    """Drop the op programs built under another default dtype (the native kernel finds
    entries in `cache` too, so it stops serving them)."""
    global _default_dtype
    now = torch.get_default_dtype()
    if now != _default_dtype:
        _default_dtype = now
        cache.clear()


def hook_default_dtype() -> None:
    """torch.set_default_dtype also tells the op cache (a call that changes the default
    dtype reaches no op kernel; without this the next division of integers would reuse
    the program, and result dtype, of the old default)."""
    original = torch.set_default_dtype
    if getattr(original, "_pjrt_hooked", False):
        return

    @functools.wraps(original)
    def set_default_dtype(d: torch.dtype) -> None:
        original(d)
        default_dtype_changed()

    set_default_dtype._pjrt_hooked = True  # type: ignore[attr-defined]
    torch.set_default_dtype = set_default_dtype


def _deterministic_state() -> tuple[bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


_deterministic = _deterministic_state()


def hook_deterministic_algorithms() -> None:
    """torch.use_deterministic_algorithms(True) drops the op programs too: a call raises
    (or warns) its nondeterminism alert where its signature is compiled (the meta function,
    or the CPU kernel's stand-ins in cpu_check), and a signature compiled before would
    reuse its program without it (put_ raised in strict mode and not after a warn_only
    run; PyTorch's check_nondeterministic_alert runs both). Turning it off keeps them."""
    original = torch.use_deterministic_algorithms
    if getattr(original, "_pjrt_hooked", False):
        return

    @functools.wraps(original)
    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        global _deterministic
        original(mode, warn_only=warn_only)
        now = _deterministic_state()
        if now != _deterministic and now[0]:
            cache.clear()
        _deterministic = now

    use_deterministic_algorithms._pjrt_hooked = True  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms = use_deterministic_algorithms


def cache_size() -> int:
    """Compiled op signatures (the cache also files entries under the native keys)."""
    return sum(1 for k in cache if type(k[0]) is tuple)


def compile_entry(call: Call, key: tuple) -> Entry:
    """A new signature's entry: its outputs' layout from the meta kernel, the views it
    writes, the buffers it donates, its traced lowering (compiled at the first launch)."""
    default_dtype_changed()  # where it changed without torch.set_default_dtype
    spec, values = call.spec, call.values
    # the disk's programs too are per default dtype (float32's keep their old names)
    default = torch.get_default_dtype()
    stable = program_key(key)
    named = (stable, call.device) if default == torch.float32 else \
        (stable, call.device, str(default))
    digest = compile_cache.digest(named, call.device)
    # (not under deterministic algorithms: the meta function and the CPU's checks raise or
    # warn their nondeterminism alerts, which a record made without them does not hold)
    record = None if torch.are_deterministic_algorithms_enabled() else \
        warm_start.LAYOUTS.get(digest)
    decoded = meta_record.decode(spec, values, call.dyn, record) if record is not None else None
    if decoded is not None:  # an earlier process ran the meta kernel, the checks, promotion
        check_arguments(spec, values)
        metas, meta_out, compute = decoded
        counters.count("meta_records_used")
    else:
        metas, meta_out = run_meta(spec, values)
        error = cpu_check(spec, values, meta_out, len(call.recs))
        if error is not None:
            raise error
        first = flat_tensors(meta_out)
        compute = apply.promotion(spec, metas, first[0].dtype if first else None)
        record = meta_record.encode(spec, metas, meta_out, compute, call.dyn)
        if record is not None:
            warm_start.LAYOUTS.note(digest, record)
    entry = Entry()

    # Out tensors PyTorch would resize: resize them (to the strides of the functional op's
    # results, as PyTorch's kernels do: TensorIterator's follow the inputs' layout; the
    # out= meta functions resize contiguous), then run again.
    if spec.is_out:
        strides = _fresh_strides(spec, metas)
        resize = [(pos, tuple(metas[pos].shape), strides.get(pos, tuple(metas[pos].stride())))
                  for pos in spec.mutated if spec.args[pos].kind == TENSOR
                  and tuple(metas[pos].shape) != tuple(values[pos].shape)]
        if resize:
            _refuse_resizing_an_input(spec, values, resize)
            entry.resize = resize
            return entry

    # The views the program writes: each tensor of each mutated arg, in order.
    for pos in spec.mutated:
        part = key[1 + pos]
        parts = part if spec.args[pos].kind in (TENSOR_LIST, OPT_TENSOR_LIST) else (part,)
        entry.targets.extend(p[:5] + p[8:9] for p in parts)
        entry.target_slots.extend((pos, j) for j in range(len(parts)))
    entry.written = tuple(dict.fromkeys(t[0] for t in entry.targets))
    # Donate a written storage's old buffer when the new one can reuse it (same dtype).
    entry.donate = tuple(
        b for b in entry.written
        if call.recs[b].value is not None
        and all(dtypes.buffer(t[1]) == call.recs[b].dtype for t in entry.targets if t[0] == b))

    # Fresh outputs, laid out as the meta result says (PyTorch's strides).
    fresh_meta = fresh_outputs(spec, meta_out)
    if any(step[0] == "value" for step in spec.returns_plan):
        outs = meta_out if isinstance(meta_out, tuple) else (meta_out,)
        entry.values = {step[1]: outs[step[1]] for step in spec.returns_plan
                        if step[0] == "value"}
    for m in fresh_meta:
        if m is None:  # an undefined tensor (e.g. a gradient output_mask turned off)
            entry.outs.append(None)
            continue
        shape, stride, jdtype = tuple(m.shape), tuple(m.stride()), dtypes.buffer(m.dtype)
        nbytes = views.span(shape, stride) * m.dtype.itemsize
        entry.outs.append((shape, stride, m.dtype, jdtype, nbytes))
    if not entry.outs and len(spec.returns_plan) == 1 and spec.returns_plan[0][0] == "alias":
        entry.alias_return = spec.returns_plan[0][1]
    returns = spec.op._schema.returns
    entry.single = (not entry.written and len(returns) == 1 and returns[0].alias_info is None
                    and opspec._kind(returns[0].type) == TENSOR)

    # What the lowering computes: the written tensors' values, else the fresh outputs.
    if spec.mutated:
        computed = [m for pos in spec.mutated for m in
                    (metas[pos] if isinstance(metas[pos], list) else [metas[pos]])]
    else:
        computed = fresh_meta
    # (numel, dtype) of each storage, by its number in the call
    buffer_shapes = {p[0]: (p[5], p[6]) for p in tensor_parts(spec, key)}
    n_bufs = len(call.recs)
    entry.order = list(entry.donate) + [i for i in range(n_bufs) if i not in entry.donate]
    entry.ordered = entry.order == list(range(n_bufs))
    traced = trace.make_trace(spec, key, entry, compute, computed, buffer_shapes)
    sharding = jax.sharding.SingleDeviceSharding(client.device(call.device))
    entry.products = spec.lowering.products
    jitted = jax.jit(cpu_kernels.rewrite(traced, entry.products), out_shardings=sharding,
                     donate_argnums=tuple(range(len(entry.donate))))
    entry.digest = digest
    entry.device = call.device
    entry.fn = _Launcher(jitted, None if entry.ordered else entry.order, entry)
    entry.trace = traced
    entry.result_avals = [((o[4] // o[3].itemsize,), o[3]) for o in entry.outs if o is not None]
    for b in entry.written:
        numel, old = buffer_shapes[b]
        new = dtypes.buffer([t for t in entry.targets if t[0] == b][-1][1])
        entry.result_avals.append(((numel * old.itemsize // new.itemsize,), new))
    entry.n_results = len(entry.result_avals)
    entry.name = str(spec.op)
    entry.random = spec.lowering.random
    entry.draws = entry.random and _draws(spec, values)
    entry.alone = not spec.lowering.eager
    entry.signature = signature_text(spec, key)
    return entry


def _draws(spec, values: list) -> bool:
    """Whether a random op's call draws bits: where its lowering names the static argument
    it draws with (draws_if), only if that is nonzero."""
    name = spec.lowering.draws_if
    if name is None:
        return True
    value = next((v for a, v in zip(spec.args, values) if a.name == name), None)
    return bool(value)


def _fresh_strides(spec, metas: list) -> dict[int, tuple]:
    """{out= argument: the strides of the functional op's result in its place}, or {}
    where there is no functional op or its results do not pair with the out= arguments."""
    functional = opspec._functional_counterpart(spec.op)
    if functional is None:
        return {}
    kw = {a.name: m for i, (a, m) in enumerate(zip(spec.args, metas)) if i not in spec.mutated}
    try:
        results = flat_tensors(functional(**kw))
    except Exception:  # noqa: BLE001 - then the meta kernel's strides stand
        return {}
    outs = [pos for pos in spec.mutated if spec.args[pos].kind == TENSOR]
    if len(results) != len(outs):
        return {}
    return {pos: tuple(r.stride()) for pos, r in zip(outs, results)
            if tuple(r.shape) == tuple(metas[pos].shape)}


def _refuse_resizing_an_input(spec, values: list, resize: list) -> None:
    """An out= tensor to resize that shares its storage with an input (torch.cat(..., out=x)
    of x itself, too large for cpu_check's stand-ins): the CPU refuses the overlap; resizing
    it would grow the input too, and the call again, forever."""
    outs = {values[pos].untyped_storage().data_ptr() for pos, _, _ in resize}
    for i, v in enumerate(values):
        if i not in spec.mutated and any(t.untyped_storage().data_ptr() in outs
                                         for t in flat_tensors(v)):
            raise RuntimeError(
                f"{spec.op}: unsupported operation: some elements of the input tensor and the "
                "written-to tensor refer to a single memory location. Please clone() the "
                "tensor before performing the operation.")


def quick(entry: Entry) -> _Launcher:
    """The entry's program compiled quickly (its own one where that is all there is, and
    for ops that draw random bits: the draws and what the op computes from them are the
    same bits in every program that makes them)."""
    if entry.quick is None:
        options = compile_cache.quick_options()
        if not options or entry.draws:
            entry.quick = entry.fn
        else:
            digest = compile_cache.digest((entry.digest, options), entry.device)
            entry.quick = _Launcher(entry.fn.jitted, entry.fn.order, entry, digest, options)
    return entry.quick


class _Launcher:
    """Calls a compiled op with its storage buffers (donated ones first) and run-time
    scalars; the first call compiles it (or loads it from the persistent cache)."""

    __slots__ = ("jitted", "order", "compiled", "name", "entry", "options")

    def __init__(self, jitted, order: list[int] | None, entry: Entry, name: str = "",
                 options: dict | None = None):
        self.jitted = jitted
        self.order = order
        self.compiled = None
        self.entry = entry
        self.name = name  # the program's digest: the entry's, or its quick program's
        self.options = options  # XLA compiler options (the quick program's)

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
        if self.options is None:
            self.entry.call = None

    def launch(self, args: list, dyn: list):
        """The program on the buffers already in its argument order (Entry.order)."""
        if self.compiled is None:
            self.take(self.obtain(args, dyn)())
        return self.compiled(*args, *dyn)

    def obtain(self, args: list, dyn: list):
        """A work that loads or compiles the program for arguments like these, touching
        nothing else (runtime/compile_pool.py runs it on a compile thread); take() its
        result."""
        entry = self.entry
        jitted, flat, name, options = self.jitted, (*args, *dyn), self.digest, self.options
        return lambda: compile_cache.obtain(jitted, flat, name, entry.device,
                                            get_side=lambda: entry.checks, options=options)

    @property
    def digest(self) -> str:
        return self.name or self.entry.digest

    def take(self, built) -> None:
        """Use the program obtain()'s work gave."""
        entry = self.entry
        if self.options is None:
            watch.describe_entry(entry.digest, entry.name, entry.signature)
            if not entry.alone:  # (a torch.compile graph notes its own recompiles)
                recompiles.note_op(entry.name, entry.signature)
        else:
            watch.describe(self.digest, "op", f"{entry.signature} (quick)",
                           [(entry.name, entry.signature, None)])
        self.compiled = compile_cache.finish(built, self.digest, set_side=entry.set_checks,
                                             drop=self.drop)
        if self.order is None and self.options is None:
            entry.call = self.compiled
