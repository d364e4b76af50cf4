"""What the executor needs to know about an ATen overload, read once from its schema."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import torch

from ..lowering import registry
from ..lowering.kinds import (  # noqa: F401 - re-exported for the executor
    GENERATOR,
    OPT_TENSOR,
    OPT_TENSOR_LIST,
    OTHER,
    SCALAR,
    SCALAR_LIST,
    TENSOR,
    TENSOR_LIST,
)
from ..lowering.kinds import of as _kind

OpOverload = torch._ops.OpOverload


_NO_DEFAULT = object()


@dataclass(frozen=True)
class ArgSpec:
    name: str
    kind: int
    write: bool  # mutated by the op (Tensor(a!))
    kwarg_only: bool
    default: object


@dataclass(frozen=True)
class OpSpec:
    op: OpOverload
    args: tuple[ArgSpec, ...]
    n_positional: int
    mutated: tuple[int, ...]  # indices of written args (self for x_, out for .out)
    is_out: bool
    is_view: bool  # returns an alias of an input without writing it
    lowering: registry.Lowering | None  # own lowering or the functional counterpart's
    uses_functional: bool  # lowering is the functional counterpart's
    n_fresh_returns: int  # returns that are new tensors (not aliases of inputs)
    kinds: tuple[int, ...]  # ArgSpec.kind of each argument
    n_args: int
    static_scalars: frozenset[str]  # Scalar args the lowering wants as Python values
    defaults: tuple  # each argument's default (_NO_DEFAULT where it has none)
    min_args: int  # arguments before the last one without a default
    returns_plan: tuple  # per return: ("alias", mutated arg index) | ("fresh",) | ("list",)
    plan: tuple  # what the native key builder reads (_fast_plan)
    dtype_from_out: int | None  # the `dtype` arg an out= call fills from `out`

    def __str__(self) -> str:
        return str(self.op)


# Reductions and scans whose out= kernels compute in the out tensor's dtype when `dtype`
# is not given (PyTorch reads it from the result): sum(x, 1, out=int64_tensor) casts each
# element before summing (-0.75 + 1.6 gives 1, not 0 from 0.85).
_COMPUTE_IN_OUT_DTYPE = frozenset({"sum", "nansum", "prod", "mean", "cumsum", "cumprod"})


def _dtype_from_out(op: OpOverload, args: list[ArgSpec], is_out: bool) -> int | None:
    if not is_out or op._schema.name.split("::")[1] not in _COMPUTE_IN_OUT_DTYPE:
        return None
    return next((i for i, a in enumerate(args) if a.name == "dtype"), None)


@functools.cache  # asked at start for every lowered op's variants, then by spec()
def _functional_counterpart(op: OpOverload) -> OpOverload | None:
    """add_.Tensor -> add.Tensor; add.out -> add.Tensor; max.dim_max -> max.dim."""
    schema = op._schema
    packet_name = op._schema.name.split("::")[1]
    ns = getattr(torch.ops, op.namespace)
    if packet_name.endswith("_") and not packet_name.endswith("__"):
        packet = getattr(ns, packet_name[:-1], None)
        if packet is None:
            return None
        return getattr(packet, op._overloadname, None)
    outs = [a for a in schema.arguments if a.kwarg_only and a.alias_info is not None
            and a.alias_info.is_write]
    if not outs:
        return None
    want = tuple((a.name, str(a.type)) for a in schema.arguments if a not in outs)
    return _functionals(op.namespace, packet_name).get(want)


@functools.cache
def _functionals(namespace: str, packet_name: str) -> dict[tuple, OpOverload]:
    """A packet's overloads that write no argument, by their arguments' (name, type); the
    first of the packet's order where two have the same (asked for every overload of
    every lowered op's packet at start: one pass over each packet, not one per overload)."""
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    found: dict[tuple, OpOverload] = {}
    for name in packet.overloads():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in args):
            continue
        found.setdefault(tuple((a.name, str(a.type)) for a in args), cand)
    return found


def _self_first(lowering: registry.Lowering, functional: OpOverload) -> registry.Lowering:
    """The functional counterpart's lowering, for an in-place op x_ whose counterpart x
    writes arguments of its own: x returns its written arguments' new values first, then
    its result, while x_ writes self (its result) first, then those arguments, in schema
    order. rrelu_with_noise_(self, noise) took rrelu_with_noise's (noise, result) as
    (self, noise): self came back holding the noise (zeros where not training)."""
    written = sum(1 for a in functional._schema.arguments
                  if a.alias_info is not None and a.alias_info.is_write)
    if not written:
        return lowering
    fn = lowering.fn

    def in_place(*args, **kwargs):
        results = list(fn(*args, **kwargs))
        return [results[written], *results[:written], *results[written + 1:]]

    return dataclasses.replace(lowering, fn=in_place)


@functools.cache
def spec(op: OpOverload) -> OpSpec:
    schema = op._schema
    args = []
    lowering = registry.get(op)
    dynamic = lowering.dynamic if lowering is not None else frozenset()
    for a in schema.arguments:
        default = a.default_value if a.has_default_value() else _NO_DEFAULT
        write = a.alias_info is not None and a.alias_info.is_write
        kind = _kind(a.type)
        if a.name in dynamic and kind == OTHER:
            kind = SCALAR  # a number the lowering takes at run time
        args.append(ArgSpec(a.name, kind, write, a.kwarg_only, default))
    mutated = tuple(i for i, a in enumerate(args) if a.write)
    is_out = any(args[i].kwarg_only for i in mutated)
    is_view = not mutated and any(r.alias_info is not None for r in schema.returns)
    uses_functional = False
    if lowering is None and mutated:
        functional = _functional_counterpart(op)
        if functional is not None:
            lowering = registry.get(functional)
            uses_functional = lowering is not None
            if uses_functional and not is_out:
                lowering = _self_first(lowering, functional)
    fresh = sum(1 for r in schema.returns if r.alias_info is None)
    return OpSpec(
        op, tuple(args), sum(1 for a in args if not a.kwarg_only), mutated, is_out, is_view,
        lowering, uses_functional, fresh, tuple(a.kind for a in args), len(args),
        lowering.static if lowering is not None else frozenset(),
        tuple(a.default for a in args),
        max((i + 1 for i, a in enumerate(args) if a.default is _NO_DEFAULT), default=0),
        _returns_plan(schema, mutated),
        _fast_plan(args, lowering.static if lowering is not None else frozenset()),
        _dtype_from_out(op, args, is_out),
    )


_tokens = itertools.count()

# The native key builder's argument codes (runtime/native/shim.cpp, lookup).
_FAST_TENSOR, _FAST_OPT_TENSOR, _FAST_TENSOR_LIST, _FAST_STATIC, _FAST_SCALAR, _FAST_OTHER, \
    _FAST_NONE, _FAST_WRITTEN_TENSOR, _FAST_WRITTEN_TENSOR_LIST = range(9)


def _is_nan(value) -> bool:
    """A NaN default: the key builder compares a passed scalar with its default to key it by
    value, which NaN defeats, so an op whose trailing default is NaN keeps the Python key."""
    return isinstance(value, float) and value != value


def _fast_plan(args: list[ArgSpec], static: frozenset) -> tuple:
    """(token, code per argument, defaults, fewest positional arguments) for the native key
    builder, which covers calls without keyword arguments whose arguments it can encode and
    whose omitted arguments are defaults that add nothing to the run-time values."""
    codes = []
    for a in args:
        if a.kind == TENSOR:
            codes.append(_FAST_WRITTEN_TENSOR if a.write else _FAST_TENSOR)
        elif a.kind == OPT_TENSOR:  # (a written optional tensor: the Python key)
            codes.append(_FAST_NONE if a.write else _FAST_OPT_TENSOR)
        elif a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
            codes.append(_FAST_WRITTEN_TENSOR_LIST if a.write else _FAST_TENSOR_LIST)
        elif a.kind == SCALAR:
            codes.append(_FAST_STATIC if a.name in static else _FAST_SCALAR)
        elif a.kind == OTHER:
            codes.append(_FAST_OTHER)
        else:  # generators and scalar lists: the Python key
            codes.append(_FAST_NONE)
    fewest = len(args)
    for i in reversed(range(len(args))):
        a = args[i]
        quiet = a.default is not _NO_DEFAULT and (
            (a.kind == OPT_TENSOR and a.default is None)
            or a.kind in (OTHER, GENERATOR)
            or (a.kind == SCALAR and (a.name in static or not _is_nan(a.default))))
        if not quiet:
            break
        fewest = i
    return (next(_tokens), tuple(codes), tuple(a.default for a in args), fewest)


def _returns_plan(schema, mutated: tuple[int, ...]) -> tuple:
    plan, m = [], iter(mutated)
    for i, r in enumerate(schema.returns):
        if r.alias_info is not None and r.alias_info.is_write:
            plan.append(("alias", next(m)))
        elif _kind(r.type) == TENSOR_LIST:
            plan.append(("list",))
        elif _kind(r.type) == TENSOR:
            plan.append(("fresh",))
        else:  # an int or float the meta kernel computes (e.g. SDPA's max_q)
            plan.append(("value", i))
    return tuple(plan)


def normalize(s: OpSpec, args: tuple, kwargs: dict) -> list:
    """The op's arguments in schema order, defaults filled in."""
    if not kwargs and len(args) >= s.min_args:
        return [*args, *s.defaults[len(args):]]
    values = list(args)
    for a in s.args[len(args):]:
        if a.name in kwargs:
            values.append(kwargs[a.name])
        elif a.default is not _NO_DEFAULT:
            values.append(a.default)
        else:
            raise TypeError(f"{s.op}: missing argument {a.name!r}")
    return values
