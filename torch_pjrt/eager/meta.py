"""The op run on meta tensors: PyTorch's own checks and the layout of its outputs,
without data (and, where it fails, run on CPU tensors for CPU PyTorch's message)."""

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

    total = sum(t.numel() for t in flat_tensors(values) if t.device.type == _PJRT)
    if total > _CPU_ERROR_MAX_ELEMENTS:
        return None
    try:
        _call_op(spec, [cpu(v) for v in values])
    except Exception as e:  # noqa: BLE001
        return e
    return None


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
