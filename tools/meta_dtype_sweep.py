"""Sweep: aten ops whose meta function gives another result dtype or shape than the CPU
kernel, on a tensor of every dtype alone, with a Python number or a 0-dim tensor, or with
tensors of another dtype (ops of up to three required arguments).

Eager pjrt ops take their output layout from the meta function (eager/meta.py), so each
difference is a result of the wrong dtype unless the op reaches pjrt decomposed or
eager/meta.py's _CPU_RESULT_DTYPES corrects it. `python tools/meta_dtype_sweep.py pjrt`
prints each with the layout pjrt gives; tests/eager/test_meta_dtypes.py runs every one
on pjrt and fails where pjrt and the CPU differ.
"""

from __future__ import annotations

import itertools
import warnings

import torch

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64]
NUMBERS = [False, True, 0, 2, 1.5, 1j]
_FORMS = (["Tensor"], ["Tensor", "Scalar"], ["Scalar", "Tensor"], ["Tensor", "Tensor"],
          ["Tensor", "Tensor", "Tensor"], ["Tensor", "Tensor", "Scalar"],
          ["Tensor", "Scalar", "Tensor"], ["Tensor", "Scalar", "Scalar"])


def _ops():
    """Functional aten overloads whose required arguments have one of the _FORMS."""
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
    """(description, arguments) of each call of an op whose required arguments are
    `kinds`: every dtype alone, with every number, and with every other dtype."""
    if kinds == ["Tensor"]:
        for dtype in DTYPES:
            yield f"{dtype} tensor", (torch.ones(3, dtype=dtype),)
            yield f"{dtype} 0-dim", (torch.ones((), dtype=dtype),)
        return
    if len(kinds) == 2 and "Scalar" in kinds:
        for dtype, number in itertools.product(DTYPES, NUMBERS):
            t = torch.ones(3, dtype=dtype)
            if kinds[0] == "Scalar":
                yield f"{number!r}, {dtype} tensor", (number, t)
            else:
                yield f"{dtype} tensor, {number!r}", (t, number)
        return
    for first, second in itertools.product(DTYPES, DTYPES):
        a, b = torch.ones(3, dtype=first), torch.ones(3, dtype=second)
        if kinds == ["Tensor", "Tensor"]:
            yield f"{first} tensor, {second} tensor", (a, b)
            yield f"{first} tensor, {second} 0-dim", (a, torch.ones((), dtype=second))
        elif kinds == ["Tensor", "Tensor", "Tensor"]:
            yield f"{first}, {second}, {second} tensors", (a, b, b)
            yield f"{first}, {second}, {first} tensors", (a, b, a)
        elif kinds == ["Tensor", "Tensor", "Scalar"]:
            for number in (True, 2, 0.5):
                yield f"{first} tensor, {second} tensor, {number!r}", (a, b, number)
        elif kinds == ["Tensor", "Scalar", "Tensor"]:
            for number in (True, 2, 0.5):
                yield f"{first} tensor, {number!r}, {second} tensor", (a, number, b)
        elif first == second:  # a tensor and two numbers
            for x, y in itertools.product((False, 2, 0.5, 1j), repeat=2):
                yield f"{first} tensor, {x!r}, {y!r}", (a, x, y)


def _meta(args):
    return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)


def _layout(out) -> list[str]:
    out = out if isinstance(out, tuple) else (out,)
    return [f"{t.dtype}{list(t.shape)}" for t in out if isinstance(t, torch.Tensor)]


def differences() -> list[tuple]:
    """(op, description, arguments, CPU layouts, meta layouts) of each call where the
    meta function and the CPU kernel give results of other dtypes or shapes."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, kinds in _ops():
            for desc, args in _calls(kinds):
                try:
                    cpu = _layout(op(*args))
                    meta = _layout(op(*_meta(args)))
                except Exception:  # noqa: BLE001 - a call either side refuses is not compared
                    continue
                if cpu != meta:
                    found.append((op, desc, args, cpu, meta))
    return found


def on_device(op, args, device: str) -> list[str]:
    """The layouts of the op's results for the same call on `device`."""
    moved = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _layout(op(*moved))


if __name__ == "__main__":
    import sys

    device = sys.argv[1] if len(sys.argv) > 1 else None  # also run each on this device
    if device == "pjrt":
        import torch_pjrt  # noqa: F401
    for op, desc, args, cpu, meta in differences():
        line = f"{op}({desc}): CPU {cpu}, meta {meta}"
        if device is not None:
            line += f", {device} {on_device(op, args, device)}"
        print(line)
