"""Sweep: aten ops whose meta function gives another result dtype or shape than the CPU
kernel, on a tensor of every dtype alone, or with a Python number or a 0-dim tensor.

Eager pjrt ops take their output layout from the meta function (eager/meta.py), so each
difference is a result of the wrong dtype unless eager/meta.py's _CPU_RESULT_DTYPES
corrects it. `python tools/meta_dtype_sweep.py` prints them; the test
tests/eager/test_meta_dtypes.py fails on one that is neither corrected nor known.
"""

from __future__ import annotations

import itertools
import warnings

import torch

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64]
NUMBERS = [False, True, 0, 2, 1.5, 1j]
_FORMS = (["Tensor"], ["Tensor", "Scalar"], ["Scalar", "Tensor"], ["Tensor", "Tensor"])


def _ops():
    """Functional aten overloads whose required arguments are a tensor, or two of
    Tensor/Scalar."""
    names = sorted({(s.name.split("::")[1], s.overload_name or "default")
                    for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")})
    for name, overload in names:
        try:
            op = getattr(getattr(torch.ops.aten, name), overload)
        except (AttributeError, RuntimeError):
            continue
        schema = op._schema
        if schema.is_mutable or any(a.is_out for a in schema.arguments):
            continue
        kinds = [str(a.type).replace("number", "Scalar") for a in schema.arguments
                 if a.default_value is None and not a.kwarg_only]
        if kinds in _FORMS and len(kinds) == len(schema.arguments) - sum(
                a.default_value is not None or a.kwarg_only for a in schema.arguments):
            yield op, kinds


def _calls(kinds):
    if kinds == ["Tensor"]:
        for dtype in DTYPES:
            yield f"{dtype} tensor", (torch.ones(3, dtype=dtype),)
            yield f"{dtype} 0-dim", (torch.ones((), dtype=dtype),)
        return
    for dtype, number in itertools.product(DTYPES, NUMBERS):
        t = torch.ones(3, dtype=dtype)
        if kinds == ["Tensor", "Tensor"]:
            other = torch.tensor(number)
            yield f"{dtype} tensor, {other.dtype} 0-dim", (t, other)
        elif kinds[0] == "Scalar":
            yield f"{number!r}, {dtype} tensor", (number, t)
        else:
            yield f"{dtype} tensor, {number!r}", (t, number)


def _meta(args):
    return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)


def differences() -> dict[str, list[str]]:
    """{op: the calls where meta and CPU disagree, with both dtypes}."""
    found: dict[str, list[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, kinds in _ops():
            for desc, args in _calls(kinds):
                try:
                    cpu = op(*args)
                    meta = op(*_meta(args))
                except Exception:  # noqa: BLE001 - a call either side refuses is not compared
                    continue
                cpu = cpu if isinstance(cpu, tuple) else (cpu,)
                meta = meta if isinstance(meta, tuple) else (meta,)
                for c, m in zip(cpu, meta):
                    if isinstance(c, torch.Tensor) and isinstance(m, torch.Tensor) and (
                            c.dtype != m.dtype or c.shape != m.shape):
                        found.setdefault(str(op), []).append(
                            f"{desc}: CPU {c.dtype}{list(c.shape)}, "
                            f"meta {m.dtype}{list(m.shape)}")
    return found


if __name__ == "__main__":
    for op, calls in sorted(differences().items()):
        print(f"{op}: {len(calls)} calls, e.g. {calls[0]}")
