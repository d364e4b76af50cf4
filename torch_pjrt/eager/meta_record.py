"""What the meta kernel said of an op signature, as one line of JSON: a warm process
rebuilds the signature's entry from it (runtime/warm_start.py keeps the lines) instead of
running PyTorch's meta kernel and the CPU's checks again. A first call of an op pays
milliseconds there (Python decompositions and their first imports): 0.34 s of the zoo
ResNet's warm first step, whose op programs load in 0.15 s.

The record holds the numbers the call took at run time (it stands only for a call with the
same ones), the meta tensors the call leaves (its written arguments, resized where
an out= op resizes them) and its result, each tensor as its shape, strides, storage
offset and dtype, or as the argument it is (the other arguments are the call's own), and
the operands' computation dtypes: type promotion's first call imports sympy (0.3 s)."""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from ..lowering import apply
from .meta import meta_args
from .opspec import OPT_TENSOR_LIST, TENSOR_LIST, OpSpec

_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class _Unrecorded(Exception):
    """A value the record has no form for: the signature is not recorded."""


def _tensor(t: torch.Tensor) -> list:
    return ["t", list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype)]


def _encode(x, args: dict[int, tuple]):
    if isinstance(x, torch.Tensor):
        where = args.get(id(x))
        return ["a", *where] if where is not None else _tensor(x)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise _Unrecorded
        return ["f", x]
    if isinstance(x, (list, tuple)):
        return ["l" if isinstance(x, list) else "u", [_encode(v, args) for v in x]]
    raise _Unrecorded


def _decode(x, metas: list):
    if not isinstance(x, list):
        return x
    tag = x[0]
    if tag == "t":
        _, shape, stride, offset, dtype = x
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        storage = torch.empty(offset + span, dtype=_DTYPES[dtype], device="meta")
        return storage.as_strided(shape, stride, offset)
    if tag == "a":
        return metas[x[1]] if len(x) == 2 else metas[x[1]][x[2]]
    if tag == "f":
        return x[1]
    items = [_decode(v, metas) for v in x[1]]
    return items if tag == "l" else tuple(items)


def _encode_compute(compute: dict | None):
    if compute is None:
        return None
    return {name: str(d) if name == apply.ROUND_TO else np.dtype(d).name
            for name, d in compute.items()}


def _decode_compute(compute: dict | None) -> dict | None:
    if compute is None:
        return None
    return {name: _DTYPES[d] if name == apply.ROUND_TO else np.dtype(d)
            for name, d in compute.items()}


def _numbers(dyn: list) -> list:
    """The call's run-time numbers as the record holds them (type and value)."""
    out = []
    for v in dyn:
        if type(v) not in (bool, int, float) or (type(v) is float and not math.isfinite(v)):
            raise _Unrecorded
        out.append([type(v).__name__, v])
    return out


def encode(spec: OpSpec, metas: list, meta_out, compute: dict | None, dyn: list
           ) -> bytes | None:
    """The record of a call whose meta kernel and checks passed (`compute`: the operands'
    computation dtypes, lowering/apply.py's promotion(); `dyn`: the numbers it took at run
    time, which the signature does not hold), or None where a value has no form here
    (then the signature runs the meta kernel in every process)."""
    args: dict[int, tuple] = {}
    for pos, m in enumerate(metas):
        if isinstance(m, torch.Tensor):
            args[id(m)] = (pos,)
        elif spec.args[pos].kind in (TENSOR_LIST, OPT_TENSOR_LIST):
            args.update((id(t), (pos, j)) for j, t in enumerate(m) if t is not None)
    try:
        written = [[pos, _encode(metas[pos], {})] for pos in spec.mutated]
        record = [written, _encode(meta_out, args), _encode_compute(compute), _numbers(dyn)]
    except _Unrecorded:
        return None
    return json.dumps(record, separators=(",", ":")).encode("ascii")


def decode(spec: OpSpec, values: list, dyn: list, text: bytes
           ) -> tuple[list, object, dict | None] | None:
    """(metas, meta_out, compute) as run_meta and promotion() would give them for this
    call, from its record; None where the record stands for other run-time numbers (the
    meta kernel checks those: fill_(1000) on int8 raises, fill_(0) does not) or does not
    read (a damaged line that still looked like one): the meta kernel runs instead."""
    try:
        written, out, compute, numbers = json.loads(text)
        if numbers != _numbers(dyn):
            return None
        metas = meta_args(spec, values)
        for pos, m in written:
            metas[pos] = _decode(m, metas)
        return metas, _decode(out, metas), _decode_compute(compute)
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError, _Unrecorded):
        return None
