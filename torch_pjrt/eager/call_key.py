"""The Python cache key of an op call: each tensor's storage (numbered in the call),
dtype, shape, stride, offset and view flags; static arguments by value; run-time
numbers by type, their values gathered apart. Programs are cached under it.

A contiguous view the op reads (does not write) at a nonzero offset has its offset among
the run-time values (DYNAMIC in its part): batches taken as `data[i]` from one device
tensor share one program instead of compiling one per offset. The native key builder
(runtime/native/op_kernel.cpp, KeyBuilder::tensor) applies the same rule,
`dynamic_offset`, in the same argument order: the program reads the values in it.

A call that writes a view of a storage another of its tensors also uses, at a run-time
offset, has those views' offsets relative to each other in its key as well (`shared_offsets`):
whether they overlap, which the CPU refuses (cpu_check, once per signature), is a matter of
those offsets, so `x[0:9].copy_(x[9:18])` and `x[0:9].copy_(x[1:10])` are two signatures.
The native key has no such part: the executor keeps these calls on the Python key."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import runtime
from ..runtime import DEVICE_TYPE as _PJRT
from ..storage import table
from .errors import device_mismatch
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
from .scalars import INT64_MAX, range_of

_records = table._records
DYNAMIC = "dyn"  # in a tensor part's offset place: the offset is a run-time value


def dynamic_offset(shape, stride, offset: int) -> bool:
    """Whether a view read by an op has its offset passed at run time: a nonzero offset
    of a non-empty view, contiguous or strided, read or written (the twin of
    KeyBuilder::dynamic_offset in C++): a loop over a tensor's rows or columns, reading or
    writing them, runs one program."""
    return offset > 0 and 0 not in shape


class Call:
    """The per-call state gathered while building the key."""

    __slots__ = ("spec", "values", "recs", "bufidx", "dyn", "device", "shared",
                 "offsets_keyed")

    def __init__(self, spec: OpSpec, values: list):
        self.spec = spec
        self.values = values
        self.recs: list[table.StorageRecord] = []
        self.bufidx: dict[int, int] = {}
        self.dyn: list[Any] = []
        self.device: int | None = None
        self.shared = False  # a storage more than one of its tensors uses
        self.offsets_keyed = False  # its key holds shared_offsets (not for the native key)

    def tensor_part(self, t, written: bool = False) -> tuple:
        """(buffer, dtype, shape, stride, offset or DYNAMIC, storage numel, storage dtype,
        uninitialized, view flags: 1 conjugate bit, 2 negative bit)."""
        try:
            ptr = storage_ptr(t, written)
        except (AttributeError, TypeError):  # a Python number PyTorch wrapped as a tensor
            self.dyn.append(t)
            return ("num", type(t))
        idx = self.bufidx.get(ptr)
        if idx is None:
            rec = _records.get(ptr)
            if rec is None:
                rec = self._other_tensor(t)
                if rec is None:
                    return ("cpu0", t.dtype)
                if written and type(rec) is table.SliceRecord:
                    raise RuntimeError(f"{table.SLICE_WRITE} (in {self.spec.op})")
            if self.device is None:
                self.device = rec.device
            elif rec.device != self.device:
                raise device_mismatch(self.spec, torch.device(_PJRT, self.device), t.device,
                                      self.values)
            idx = self.bufidx[ptr] = len(self.recs)
            self.recs.append(rec)
        else:
            rec = self.recs[idx]
            self.shared = True
        offset = t.storage_offset()
        if offset and dynamic_offset(t.shape, t.stride(), offset):
            self.dyn.append(offset)
            offset = DYNAMIC
        return (idx, t.dtype, t.shape, t.stride(), offset, rec.numel,
                rec.dtype, rec.value is None, t.is_conj() + 2 * t.is_neg())

    def _other_tensor(self, t: torch.Tensor) -> table.StorageRecord | None:
        """A tensor whose storage is not in the table: foreign pjrt, CPU scalar, or an error."""
        if t.device.type == _PJRT:
            return table.record(t.untyped_storage())
        if t.dim() == 0 and t.device.type == "cpu":
            self.dyn.append(t.item())
            return None
        here = torch.device(_PJRT, self.device if self.device is not None else 0)
        raise device_mismatch(self.spec, here, t.device, self.values)


_data_address = torch._C._data_address


def storage_ptr(t: torch.Tensor, written: bool) -> int:
    """The data pointer of `t`'s storage, its key in the table. A copy-on-write storage
    (torch._lazy_clone) is read through the buffer it shares, as the CPU does: only a
    write gives it its own (the mutable access, UntypedStorage.data_ptr(), makes PyTorch
    materialize it, and the allocator's copy callback copies the buffer)."""
    if written:
        return t.untyped_storage().data_ptr()
    return _data_address(t)


def key_of(call: Call) -> tuple:
    """The call's key, filling `call` with its storages, device and run-time values."""
    spec = call.spec
    parts: list = [spec.op]
    ranges: list[int] = []
    dyn = call.dyn
    bufidx = call.bufidx
    for kind, a, v in zip(spec.kinds, spec.args, call.values):
        if kind == TENSOR:
            # call.tensor_part(v), inlined for the common case: a pjrt tensor whose storage
            # is in the table and not seen yet in this call.
            try:
                ptr = storage_ptr(v, a.write)
            except (AttributeError, TypeError):
                parts.append(call.tensor_part(v))
                continue
            rec = _records.get(ptr)
            offset = v.storage_offset()
            if rec is None or ptr in bufidx or offset or (call.device is not None
                                                          and rec.device != call.device):
                parts.append(call.tensor_part(v, a.write))
                continue
            call.device = rec.device
            idx = bufidx[ptr] = len(call.recs)
            call.recs.append(rec)
            parts.append((idx, v.dtype, v.shape, v.stride(), 0, rec.numel,
                          rec.dtype, rec.value is None, v.is_conj() + 2 * v.is_neg()))
        elif kind == SCALAR:
            if a.name in spec.static_scalars or (v == a.default and type(v) is type(a.default)):
                parts.append(("s", v))
            else:
                if type(v) is int and v > INT64_MAX:  # uint64's upper half: JAX parses a
                    v = np.uint64(v)  # Python int as int64 and overflows
                dyn.append(v)
                parts.append(type(v))
                ranges.append(range_of(v))
        elif kind == OPT_TENSOR:
            parts.append(None if v is None else call.tensor_part(v, a.write))
        elif kind == TENSOR_LIST or kind == OPT_TENSOR_LIST:
            parts.append(tuple(None if t is None else call.tensor_part(t, a.write)
                               for t in v))
        elif kind == SCALAR_LIST:  # run-time values, like Scalar (an optimizer's step sizes)
            dyn.extend(v)
            parts.append(("sl", tuple(type(x) for x in v)))
        elif kind == GENERATOR:
            parts.append(GENERATOR)
        else:
            parts.append(_hashable(v))
    if call.shared and spec.mutated:
        offsets = shared_offsets(spec, call.values)
        if offsets:
            call.offsets_keyed = True
            parts.append(("offsets", offsets))
    if ranges:
        parts.append((RANGES, tuple(ranges)))
    return tuple(parts)


def shared_offsets(spec: OpSpec, values: list) -> tuple:
    """For each storage that the call writes through one view and uses through another,
    where one of them has a run-time offset: (argument, index in it, offset from the
    first of them) of each of its views, in argument order; () where there is none."""
    groups: dict[int, list] = {}
    for pos, j, t in tensor_args(spec, values):
        if not isinstance(t, torch.Tensor) or t.device.type != _PJRT:
            continue
        write = spec.args[pos].write
        try:
            ptr = storage_ptr(t, write)
        except (AttributeError, TypeError):
            continue
        groups.setdefault(ptr, []).append((pos, j, t, write))
    out = []
    for views in groups.values():
        if len(views) < 2 or not any(w for *_, w in views) or not any(
                dynamic_offset(t.shape, t.stride(), t.storage_offset()) for _, _, t, _ in views):
            continue
        base = views[0][2].storage_offset()
        out.extend((pos, j, t.storage_offset() - base) for pos, j, t, _ in views)
    return tuple(out)


RANGES = "ranges"  # the last key part's tag: the run-time numbers' ranges (scalars.range_of)


def program_key(key: tuple) -> tuple:
    """The key without its numbers' ranges: what the op's program depends on (a number of
    another range reruns the checks, not the compile)."""
    last = key[-1]
    if type(last) is tuple and len(last) == 2 and last[0] is RANGES:
        return key[:-1]
    return key


def _hashable(v):
    """A static argument as a key part (lists as tuples; a device by its type)."""
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, torch.device):
        return ("device", v.type)  # the index is the call's device, not part of the program
    return v


def signature_text(spec: OpSpec, key: tuple) -> str:
    """'aten.add.Tensor(float32[8, 3], float32[3])': what a recompile message shows."""
    args = []
    for p in tensor_parts(spec, key):
        args.append(f"{str(p[1]).removeprefix('torch.')}{list(p[2])}")
    return f"{spec.op}({', '.join(args)})"


def tensor_args(spec: OpSpec, items):
    """(argument position, index in its list, item) of each tensor argument's item, in
    argument order; `items` are the call's values or its key's parts (key[1:]). A tensor
    argument's index is 0; absent optional ones are given as None."""
    for pos, (a, item) in enumerate(zip(spec.args, items)):
        if a.kind in (TENSOR, OPT_TENSOR):
            yield pos, 0, item
        elif a.kind in (TENSOR_LIST, OPT_TENSOR_LIST):
            for j, x in enumerate(item):
                yield pos, j, x


def tensor_parts(spec: OpSpec, key: tuple):
    """Every pjrt tensor part of a key, in argument order."""
    for _, _, p in tensor_args(spec, key[1:]):
        if p is not None and isinstance(p[0], int):
            yield p


def unhashable(v):
    """A static argument back from its key part: _hashable's inverse."""
    if isinstance(v, tuple) and v[:1] == ("device",):
        return torch.device(v[1])
    if isinstance(v, tuple):
        return [unhashable(x) for x in v]
    return v


def factory_device(spec: OpSpec, values: list) -> int:
    """The device of a call without pjrt tensors (a factory): its `device`, else current."""
    for a, v in zip(spec.args, values):
        if a.name == "device" and v is not None:
            dev = torch.device(v)
            return dev.index if dev.index is not None else runtime.shim().current_device()
    return runtime.shim().current_device()
