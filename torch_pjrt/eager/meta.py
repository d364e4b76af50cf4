"""The op run on meta tensors: PyTorch's own checks and the layout of its outputs,
without data (and, where it fails, run on CPU tensors for CPU PyTorch's message), and on
small CPU stand-ins, once per signature, for the checks that only CPU kernels make
(cpu_check)."""

from __future__ import annotations

import contextlib
import re
import warnings

import torch
import torch._prims_common as _prims_common

from ..runtime import DEVICE_TYPE as _PJRT
from ..runtime import platform
from ..storage import views
from .opspec import GENERATOR, OPT_TENSOR, OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ArgSpec, OpSpec
from .refusals import refuses


def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.device.type != _PJRT:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_value(a: ArgSpec, v):
    if a.kind in (TENSOR, OPT_TENSOR):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0 \
                and not a.write:
            # a CPU 0-dim tensor goes with a tensor of any device (a CPU scalar, as
            # TensorIterator treats it); some meta functions check devices without that
            # rule (masked_fill's value: x.masked_fill(mask, torch.tensor(-inf)))
            return torch.empty((), dtype=v.dtype, device="meta")
        return None if v is None else _meta_tensor(v)
    if a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
        return [None if t is None else _meta_tensor(t) for t in v]
    if a.kind == GENERATOR:
        return None
    if isinstance(v, torch.device) and v.type == _PJRT:
        return torch.device("meta")
    return v


def _split(spec: OpSpec, values: list) -> tuple[list, dict]:
    """The call's positional and keyword arguments."""
    pos, kw = [], {}
    for a, v in zip(spec.args, values):
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return pos, kw


def _call_op(spec: OpSpec, values: list):
    pos, kw = _split(spec, values)
    try:
        return spec.op(*pos, **kw)
    except RuntimeError:
        if not any(a.kind in (TENSOR, OPT_TENSOR) and isinstance(v, (bool, int, float, complex))
                   for a, v in zip(spec.args, values)):
            raise
    # A number where the schema has a tensor: one that PyTorch wrapped as a tensor (the
    # composite xlogy(2.0, t) calls xlogy.Tensor so), which the overload, called from
    # Python, refuses. The packet picks the overload that takes the number
    # (xlogy.Scalar_Self), and its result type is the wrapped number's.
    return spec.op.overloadpacket(*pos, **kw)


def meta_args(spec: OpSpec, values: list) -> list:
    """The call's arguments as the meta kernel takes them: meta tensors for its tensors."""
    return [_meta_value(a, v) for a, v in zip(spec.args, values)]


@contextlib.contextmanager
def _no_cuda_alerts():
    """Under torch.use_deterministic_algorithms(True): PyTorch's meta functions take a meta
    tensor for a CUDA one (device_hint) and raise, or warn, the nondeterminism alerts of
    CUDA kernels ("_histc_cuda with floating point input", "median CUDA with indices
    output"). The op runs as an XLA program, not those kernels, and XLA:CPU's programs
    are deterministic: there the meta function's CUDA alerts are dropped (its others, and
    on an accelerator all of them, stand)."""
    if not torch.are_deterministic_algorithms_enabled() or not platform.cpu_platform():
        yield
        return
    original = _prims_common.alert_not_deterministic

    def alert(caller: str) -> None:
        if "cuda" not in caller.lower():
            original(caller)

    _prims_common.alert_not_deterministic = alert
    try:
        yield
    finally:
        _prims_common.alert_not_deterministic = original


def check_arguments(spec: OpSpec, values: list) -> None:
    """The CPU's checks of the call's numbers that neither the meta kernel nor the
    signature holds (randperm's n against its out= dtype, ...): raise as the CPU does."""
    precheck = _CPU_ARGUMENT_CHECKS.get(str(spec.op))
    if precheck is not None:
        precheck(values)


def run_meta(spec: OpSpec, values: list):
    """The op on meta tensors: PyTorch's checks and output metadata, without data."""
    metas = meta_args(spec, values)
    check_arguments(spec, values)
    accept = _CPU_ACCEPTS.get(str(spec.op))
    if accept is not None and (written := accept(values)) is not None:
        return metas, metas[written]
    if str(spec.op) in _BYTE_TARGETS:
        # the CPU's nll_loss kernel takes a uint8 target as it takes int64; the meta
        # function (a decomposition through gather) refuses it
        metas = [m.to(torch.int64) if a.name == "target" and isinstance(m, torch.Tensor)
                 and m.dtype == torch.uint8 else m for a, m in zip(spec.args, metas)]
    try:
        with _no_cuda_alerts():
            if str(spec.op) in _KEEP_OUT_SHAPE:
                with warnings.catch_warnings():  # "An output ... was resized": not on the CPU
                    warnings.simplefilter("ignore", UserWarning)
                    out = _call_op(spec, metas)
            else:
                out = _call_op(spec, metas)
    except Exception as meta_error:  # noqa: BLE001 - re-raised as the CPU's own error
        raise _cpu_error(spec, values) or meta_error from None
    if str(spec.op) in _KEEP_OUT_SHAPE:
        pos = spec.mutated[0]
        if out.numel() == values[pos].numel() and tuple(out.shape) != tuple(values[pos].shape):
            metas[pos] = out = _meta_tensor(values[pos])
    fix = _CPU_RESULT_DTYPES.get(str(spec.op))
    return metas, (fix(values, out) if fix is not None else out)


_RANDPERM_LIMITS = {torch.float16: (2 ** 11 + 1, "2049", "Half"),
                    torch.float32: (2 ** 24 + 1, "2^24+1", "Float"),
                    torch.float64: (2 ** 53 + 1, "2^53+1", "Double")}


def _randperm_precision(values) -> None:
    """The CPU's refusal of a randperm whose n a floating out= dtype cannot count to exactly
    (check_supported_max_int_with_precision). The meta function has none, and cpu_check's
    stand-ins skip a call this large (randperm(2**24 + 2, out=float32) ran)."""
    n = values[0]
    out = next((v for v in reversed(values) if isinstance(v, torch.Tensor)), None)
    limit = _RANDPERM_LIMITS.get(out.dtype) if out is not None else None
    if limit is not None and isinstance(n, int) and n > limit[0]:
        raise RuntimeError(f"n cannot be greater than {limit[1]} for {limit[2]} type.")


# Checks the CPU kernel makes on the arguments before anything else, and the meta function
# lacks.
_CPU_ARGUMENT_CHECKS = {"aten.randperm.out": _randperm_precision,
                        "aten.randperm.generator_out": _randperm_precision}


# Factories whose CPU and CUDA kernels resize the out= tensor only where its element count
# is not the result's (`if (result.numel() != steps) result.resize_({steps})`): the out=
# view of linspace(0, 3, 4, out=x.narrow(1, 1, 2)) keeps its [2, 2] shape and gets the
# values in row-major order. The meta functions resize it to [4] (writing other elements).
_KEEP_OUT_SHAPE = {"aten.linspace.out", "aten.logspace.out", "aten.arange.start_out",
                   "aten.arange.out", "aten.range.out"}


def _bool_to_bool_power(values) -> bool:
    return values[0].dtype == torch.bool and type(values[1]) is bool


def _bool_pow(values, out):
    """A bool tensor to a bool power is bool on CPU and CUDA (the meta function, taking the
    bool for an int, says int64)."""
    return torch.empty_like(out, dtype=torch.bool) if _bool_to_bool_power(values) else out


def _bool_pow_written(values) -> int | None:
    """`x.pow_(False)` and `torch.pow(x, True, out=y)` of bool tensors: CPU and CUDA write
    bool; the meta function refuses (its int64 result cannot be cast to bool). The
    position of the tensor written (its layout is the result's), or None."""
    written = 0 if len(values) == 2 else len(values) - 1  # self, or out=
    if _bool_to_bool_power(values) and values[written].dtype == torch.bool:
        return written
    return None


def _input_dtype(values, out):
    """Ops whose result is made like their first tensor by code CPU and CUDA share (huber
    and soft margin losses, normal of a mean and a std tensor): a bfloat16 input with a
    float32 target gives bfloat16; the meta function promotes."""
    return torch.empty_like(out, dtype=values[0].dtype)


# Ops whose meta function gives another result dtype than the CPU kernel, found by
# tools/meta_dtype_sweep.py (every aten op of a tensor alone, with a scalar or a 0-dim
# tensor, or with a tensor of another dtype).
_CPU_RESULT_DTYPES = {"aten.pow.Tensor_Scalar": _bool_pow,
                      "aten.huber_loss.default": _input_dtype,
                      "aten.soft_margin_loss.default": _input_dtype,
                      "aten.normal.Tensor_Tensor": _input_dtype}
# nll_loss's uint8 targets, taken as int64 (nll_loss2d's CPU kernels refuse a Byte target:
# "expected scalar type Long")
_BYTE_TARGETS = frozenset({"aten.nll_loss_forward.default", "aten.nll_loss_backward.default"})
# Calls the meta function refuses and CPU and CUDA run: each gives the position of the
# argument whose layout the result has, or None to leave the call to the meta function.
_CPU_ACCEPTS = {"aten.pow_.Scalar": _bool_pow_written,
                "aten.pow.Tensor_Scalar_out": _bool_pow_written}


_CPU_ERROR_MAX_ELEMENTS = 1 << 20
# The stand-ins of cpu_check, run on every new signature: small enough to cost less than
# tracing the op (a call over more elements is not checked). Calls that write (in-place,
# out=) are where meta functions miss most CPU checks; a functional one (a matrix product)
# may cost far more per element.
_CHECK_MAX_ELEMENTS = 1 << 16
_CHECK_MAX_ELEMENTS_FUNCTIONAL = 1 << 12


def _cpu_error(spec: OpSpec, values: list, layout: str = "strided",
               fill: int = 0) -> Exception | None:
    """The error CPU PyTorch gives for the same call (its messages are the familiar ones),
    found by running the op on CPU tensors of the same metadata, their every byte `fill`;
    None if it does not fail. `layout`: "strided", with
    the same strides; "aliased", also sharing storages as these do; "dense", contiguous."""
    storages: dict[int, torch.Tensor] = {}
    same: dict[int, torch.Tensor] = {}  # one CPU tensor per tensor (PyTorch checks identity)

    def host(nbytes: int) -> torch.Tensor:
        return torch.full((nbytes,), fill, dtype=torch.uint8)

    def cpu(v):
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT and layout != "dense":
            if id(v) in same:
                return same[id(v)]
            if layout == "aliased":
                # (the const address: a mutable one would materialize a lazy clone)
                key = torch._C._data_address(v)
                nbytes, offset = v.untyped_storage().nbytes(), v.storage_offset()
            else:
                key, offset = id(v), 0
                nbytes = v.element_size() * views.span(v.shape, v.stride())
            h = storages.get(key)
            if h is None:
                h = storages[key] = host(nbytes)
            same[id(v)] = torch.empty(0, dtype=v.dtype).set_(
                h.untyped_storage(), offset, v.shape, v.stride())
            return same[id(v)]
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT:
            t = torch.zeros(v.shape, dtype=v.dtype)
            return t if fill == 0 else cpu_filled(t)
        if isinstance(v, list):
            return [cpu(x) for x in v]
        if isinstance(v, torch.device) and v.type == _PJRT:
            return torch.device("cpu")
        if isinstance(v, torch.Generator):
            return None
        return v

    def cpu_filled(t: torch.Tensor) -> torch.Tensor:
        torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).fill_(fill)
        return t

    tensors = [t for t in flat_tensors(values) if t.device.type == _PJRT]
    if sum(t.numel() for t in tensors) > _CPU_ERROR_MAX_ELEMENTS:
        return None
    if layout == "aliased" and sum({torch._C._data_address(t): t.untyped_storage().nbytes()
                                    for t in tensors}.values()) > 8 * _CPU_ERROR_MAX_ELEMENTS:
        layout = "strided"  # (a small view of a large storage: not worth a host copy of it)
    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(spec.op.name(), "CPU"):
        return None  # a device-only op (a fused RNN cell): the CPU would only say it lacks it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the call itself warns, where it does)
            _call_op(spec, [cpu(v) for v in values])
    except Exception as e:  # noqa: BLE001
        return e
    return None


# Dtype limits of CPU kernels that the meta function (and CUDA) accept: the backward of a
# bfloat16 layer or batch norm gets the float32 statistics its forward returns on pjrt (as on
# CUDA), which the CPU kernel, whose forward returns bfloat16 ones, refuses.
_CPU_KERNEL_DTYPES = re.compile(r"expected scalar type \w+ but found \w+|^mixed dtype \(CPU\)")
# Checks of the data that neither fill of the stand-ins passes (0, and every byte 1), so
# that the two errors agree although real data passes: lu_unpack's pivots lie in 1..n.
_CPU_DATA_CHECKS = re.compile(r"^pivots passed to lu_unpack must be between 1 and")


def cpu_check(spec: OpSpec, values: list, meta_out, storages: int) -> Exception | None:
    """The CPU kernel's error for a call whose meta function passes: the checks that only
    the kernel makes (a written tensor overlapping itself or an input, a result dtype the
    written tensor cannot hold, values that do not broadcast into an index_put_, a Python
    number that does not fit the dtype...). Run once per new signature, on small CPU
    stand-ins of the call's tensors, laid out and aliased as they are and zero-filled; an
    error counts only if the same one comes again on other data (every byte 1: True, small
    positive numbers, large integers), so that an error of the data (a division by zero, an
    index out of range) never does: the device checks those when the program runs. None
    where the CPU runs the call. `storages`: how many storages the call's tensors use (a
    call that writes into aliased tensors is checked up to a larger size: CPU kernels
    refuse most overlaps)."""
    if spec.op.namespace != "aten" or spec.lowering is None:
        return None
    tensors = [t for t in flat_tensors(values) if t.device.type == _PJRT]
    aliased = bool(spec.mutated) and (storages < len(tensors) or any(
        t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1
        for pos in spec.mutated for t in flat_tensors(values[pos])))
    random = spec.lowering.random or any(a.kind == GENERATOR for a in spec.args)
    limit = (_CPU_ERROR_MAX_ELEMENTS if aliased else
             _CHECK_MAX_ELEMENTS if spec.mutated else _CHECK_MAX_ELEMENTS_FUNCTIONAL)
    if sum(t.numel() for t in tensors) + sum(t.numel() for t in flat_tensors(meta_out)) > limit:
        return dtype_refusal(spec.op, *_split(spec, values), random=random)
    rng = torch.get_rng_state() if random else None
    try:
        error = _cpu_error(spec, values, "aliased")
        if error is None or isinstance(error, torch.linalg.LinAlgError) \
                or (isinstance(error, NotImplementedError) and not refuses(spec.op, error)) \
                or _CPU_KERNEL_DTYPES.search(str(error)) or _CPU_DATA_CHECKS.search(str(error)):
            return None  # (NotImplementedError: a dtype the CPU lacks and CUDA takes)
        again = _cpu_error(spec, values, "aliased", fill=1)
    finally:
        if rng is not None:
            torch.set_rng_state(rng)
    if type(again) is not type(error) or str(again) != str(error):
        return None
    return error


def dtype_refusal(op: torch._ops.OpOverload, args, kwargs: dict, random: bool = False,
                  sized: bool = True) -> Exception | None:
    """The CPU kernel's refusal of the call's dtypes that CUDA makes too (refusals.py), for
    a call too large for cpu_check's stand-ins or one that reaches no lowering as itself:
    found on zero-filled stand-ins of the same shapes, or of at most one element per
    dimension where those would be large (a kernel picks its dtypes before it looks at
    sizes). None where the CPU takes them, the stand-ins fail otherwise, or their result
    would not be small (`sized`: the meta function tells; a data-dependent op's result is
    no larger than its zero-filled inputs say)."""
    made: dict[tuple, torch.Tensor] = {}  # one stand-in per tensor (kernels check identity)
    shrink = sum(t.numel() for t in flat_tensors([args, list(kwargs.values())])
                 if t.device.type == _PJRT) > _CHECK_MAX_ELEMENTS_FUNCTIONAL

    def small(v, device: str):
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT:
            if (id(v), device) not in made:
                shape = [min(n, 1) for n in v.shape] if shrink else v.shape
                made[id(v), device] = torch.zeros(shape, dtype=v.dtype, device=device)
            return made[id(v), device]
        if isinstance(v, (list, tuple)):
            return type(v)(small(x, device) for x in v)
        if isinstance(v, dict):
            return {k: small(x, device) for k, x in v.items()}
        if isinstance(v, torch.device) and v.type == _PJRT:
            return torch.device(device)
        return None if isinstance(v, torch.Generator) else v

    def call(device: str):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return op(*small(tuple(args), device), **small(kwargs, device))

    try:  # the stand-ins' result must be small (sizes given as numbers stay as they are)
        if sized and sum(t.numel() for t in flat_tensors(call("meta"))) \
                > _CHECK_MAX_ELEMENTS_FUNCTIONAL:
            return None
    except Exception:  # noqa: BLE001 - the stand-ins do not fit the op: nothing to say
        return None
    rng = torch.get_rng_state() if random else None
    try:
        call("cpu")
    except NotImplementedError as e:
        return e if refuses(op, e) else None
    except Exception:  # noqa: BLE001
        return None
    finally:
        if rng is not None:
            torch.set_rng_state(rng)
    return None


_refusals: dict[tuple, Exception | None] = {}


def _signature(v):
    """What a refusal depends on: the dtypes of the tensors, the types of the rest."""
    if isinstance(v, torch.Tensor):
        return v.dtype
    if isinstance(v, (list, tuple)):
        return tuple(_signature(x) for x in v)
    return type(v)


def refuse_dtypes(op: torch._ops.OpOverload, args: tuple, kwargs: dict,
                  sized: bool = True) -> None:
    """Raise dtype_refusal's error for a call that reaches no lowering as itself (a
    decomposition would compute it from ops that take the dtypes: multi_margin_loss of
    integers); looked up once per op and dtypes."""
    key = (op, _signature(args), *((k, _signature(v)) for k, v in kwargs.items()))
    if key not in _refusals:
        error = dtype_refusal(op, args, kwargs, sized=sized)
        # (kept without its traceback, whose frames hold the call's tensors)
        _refusals[key] = None if error is None else error.with_traceback(None)
    if _refusals[key] is not None:
        raise _refusals[key]


def flat_tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in flat_tensors(item)]
    return []


def fresh_outputs(spec: OpSpec, meta_out) -> list[torch.Tensor]:
    """The meta tensors of the returns that are new tensors (not aliases of inputs)."""
    returns = spec.op._schema.returns
    outs = meta_out if len(returns) > 1 else (meta_out,)
    fresh = []
    for r, m in zip(returns, outs):
        if r.alias_info is None:
            fresh.extend(flat_tensors(m) if m is not None else [None])
    return fresh
