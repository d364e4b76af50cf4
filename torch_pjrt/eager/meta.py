"""The op run on meta tensors: PyTorch's own checks and the layout of its outputs,
without data (and, where it fails, run on CPU tensors for CPU PyTorch's message; where
it writes into a tensor that overlaps another argument, on aliased CPU tensors for the
CPU kernels' overlap checks, which meta tensors cannot make)."""

from __future__ import annotations

import torch

from ..runtime import DEVICE_TYPE as _PJRT
from .opspec import GENERATOR, OPT_TENSOR, OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ArgSpec, OpSpec


def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.device.type != _PJRT:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_value(a: ArgSpec, v):
    if a.kind in (TENSOR, OPT_TENSOR):
        return None if v is None else _meta_tensor(v)
    if a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
        return [None if t is None else _meta_tensor(t) for t in v]
    if a.kind == GENERATOR:
        return None
    if isinstance(v, torch.device) and v.type == _PJRT:
        return torch.device("meta")
    return v


def _call_op(spec: OpSpec, values: list):
    pos, kw = [], {}
    for a, v in zip(spec.args, values):
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return spec.op(*pos, **kw)


def run_meta(spec: OpSpec, values: list):
    """The op on meta tensors: PyTorch's checks and output metadata, without data."""
    metas = [_meta_value(a, v) for a, v in zip(spec.args, values)]
    try:
        return metas, _call_op(spec, metas)
    except Exception as meta_error:  # noqa: BLE001 - re-raised as the CPU's own error
        raise _cpu_error(spec, values) or meta_error from None


_CPU_ERROR_MAX_ELEMENTS = 1 << 20


def _cpu_error(spec: OpSpec, values: list, layout: str = "strided") -> Exception | None:
    """The error CPU PyTorch gives for the same call (its messages are the familiar ones),
    found by running the op on zero CPU tensors of the same metadata; None if it does not
    fail. `layout`: "strided", with the same strides; "aliased", also sharing storages as
    these do; "dense", contiguous."""
    storages: dict[int, torch.Tensor] = {}
    same: dict[int, torch.Tensor] = {}  # one CPU tensor per tensor (PyTorch checks identity)

    def cpu(v):
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT and layout == "aliased":
            if id(v) in same:
                return same[id(v)]
            s = v.untyped_storage()
            host = storages.get(s.data_ptr())
            if host is None:
                host = storages[s.data_ptr()] = torch.zeros(s.nbytes(), dtype=torch.uint8)
            same[id(v)] = torch.empty(0, dtype=v.dtype).set_(
                host.untyped_storage(), v.storage_offset(), v.shape, v.stride())
            return same[id(v)]
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT and layout == "dense":
            return torch.zeros(v.shape, dtype=v.dtype)
        if isinstance(v, torch.Tensor) and v.device.type == _PJRT:
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).zero_()
        if isinstance(v, list):
            return [cpu(x) for x in v]
        if isinstance(v, torch.device) and v.type == _PJRT:
            return torch.device("cpu")
        if isinstance(v, torch.Generator):
            return None
        return v

    tensors = [t for t in flat_tensors(values) if t.device.type == _PJRT]
    if sum(t.numel() for t in tensors) > _CPU_ERROR_MAX_ELEMENTS:
        return None
    if layout == "aliased" and sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                                    for t in tensors}.values()) > 8 * _CPU_ERROR_MAX_ELEMENTS:
        return None  # (a small view of a large storage: not worth a host copy of it)
    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(spec.op.name(), "CPU"):
        return None  # a device-only op (a fused RNN cell): the CPU would only say it lacks it
    try:
        _call_op(spec, [cpu(v) for v in values])
    except Exception as e:  # noqa: BLE001
        return e
    return None


def overlap_error(spec: OpSpec, values: list, storages: int) -> Exception | None:
    """The CPU's error for a call that writes a tensor overlapping itself or another
    argument (CPU kernels refuse most: "unsupported operation: ... refer to a single memory
    location"), found by running the op on CPU tensors aliased as these are, where the
    same call on dense tensors runs; None when nothing aliases or the CPU accepts it.
    `storages`: how many storages the call's tensors use."""
    if not spec.mutated or spec.op.namespace != "aten":
        return None
    tensors = [t for t in flat_tensors(values) if t.device.type == _PJRT]
    written = [t for pos in spec.mutated for t in flat_tensors(values[pos])]
    if storages == len(tensors) and not any(
            t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1 for t in written):
        return None
    error = _cpu_error(spec, values, "aliased")
    if error is None or _cpu_error(spec, values, "dense") is not None:
        return None  # (zero data may be an error of its own: then it is not the layout's)
    return error


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
