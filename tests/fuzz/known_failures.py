"""Known differences between pjrt and the CPU that the fuzzer finds, one reason each.

An entry matches a difference (one line of observe.differences) by a regular expression,
optionally only in some modes or in programs that contain some code; a program whose every
difference an entry matches counts as a known failure, any other difference fails
tests/fuzz/test_fuzz.py. Fix one, delete its entry: the list only shrinks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .programs import Program

ALL = ("strict", "fused", "debug", "compile")
EAGER = ("strict", "fused", "debug")


@dataclass(frozen=True)
class Known:
    reason: str
    difference: str  # a regular expression searched in the difference's text
    modes: tuple[str, ...] = ALL
    program: str | None = None  # a regular expression the program's source must contain


_CPU_ONLY = ("the CPU kernel's own check, which the meta function pjrt runs does not make "
             "(eager/meta.py runs no CPU kernel unless the meta function fails)")

KNOWN: dict[str, Known] = {
    "dtype not implemented by the CPU kernel": Known(
        "a dtype the CPU kernel does not implement (NotImplementedError): the lowering "
        "computes it, or JAX rejects it with its own TypeError/ValueError; " + _CPU_ONLY,
        r"CPU raised NotImplementedError"),
    "in-place result dtype": Known(
        "an in-place op whose result dtype cannot be cast to self's (mul_, masked_fill_ "
        "and others): " + _CPU_ONLY,
        r"CPU raised RuntimeError \((result type \w+ can't be cast to the desired output "
        r"type|Found dtype \w+ but expected|Index put requires the source and destination "
        r"dtypes match|.*with a bool tensor is not supported|\w+\(\): does not support bool)"),
    "memory overlap": Known(
        "writing into a tensor that overlaps itself or an input (`unsupported operation: "
        "... refer to a single memory location`): PyTorch checks storages, which the meta "
        "tensors pjrt runs the op on do not share",
        r"CPU raised RuntimeError \(unsupported operation: "),
    "lowering errors from JAX": Known(
        "a call PyTorch rejects whose meta function passes: the lowering then fails in JAX "
        "with JAX's own TypeError or ValueError instead of raising the CPU's error",
        r"CPU raised \w+ .*pjrt raised (ValueError|TypeError) \(aten\."),
    "index_select and index_put_ shape errors": Known(
        "index_select of a 0-dim index tensor with several values, index_put_ of values "
        "that do not broadcast: " + _CPU_ONLY,
        r"CPU raised RuntimeError \((shape mismatch: value tensor|index_select\(\): Index to "
        r"scalar)"),
    "copy_ from an empty source": Known(
        "copy_ from an empty tensor into a non-empty one: the meta function does not check "
        "that the source broadcasts",
        r"CPU raised RuntimeError \(The size of tensor a \(\d+\) must match the size of tensor "
        r"b \(0\)", EAGER, r"copy_\("),
    "index_select negative index": Known(
        "index_select with a negative index: the CPU raises (it takes none), the lowering "
        "wraps it", r"CPU raised IndexError \(index out of range in self\), pjrt ran"),
    "index check on an empty result": Known(
        "an out-of-range index that selects no element (the indexed tensor is empty): the "
        "CPU checks only the elements it writes; the device check rejects it",
        r"(pjrt raised IndexError \(index out of range for dimension|reading it raised "
        r"IndexError: index out of range for dimension)"),
    "CPU 0-dim value of masked_fill": Known(
        "masked_fill with a CPU 0-dim value (PyTorch takes it for any device): the meta "
        "function sees a CPU tensor beside meta ones",
        r"Expected `value` to be on same device as `a`"),
    "resize keeps the storage": Known(
        "an out= or resize_ that grows a tensor gives it a new storage on pjrt; the CPU grows "
        "the same storage, which its other views keep sharing",
        r"\.(storage|base|same): pjrt ", EAGER, r"resize_|out="),
    "resized out= strides": Known(
        "an out= tensor PyTorch resizes gets the strides TensorIterator picks for it (the "
        "inputs' layout); pjrt resizes it contiguous",
        r"\.stride: pjrt ", EAGER, r"out="),
    "scalar value conversion": Known(
        "a Python number that does not fit the dtype it is converted to (fill_ of an "
        "integer tensor with a complex number): the CPU kernel checks the value; pjrt keys "
        "its programs by the number's type and checks nothing at run time",
        r"CPU raised RuntimeError \(value cannot be converted to type \w+ without overflow"),
    "debug mode after a failed op": Known(
        "debug mode: an op whose CPU comparison raises after the program ran has donated "
        "its written buffer ('Array has been deleted' when read later)",
        r"Array has been deleted", ("debug",)),
}


def explain(program: Program, mode: str, diffs: list[str]) -> str | None:
    """The name of the known failure that explains all of `diffs`, or None."""
    source = "\n".join(program.all_lines)
    names = []
    for diff in diffs:
        name = next((n for n, k in KNOWN.items()
                     if mode in k.modes and re.search(k.difference, diff)
                     and (k.program is None or re.search(k.program, source))), None)
        if name is None:
            return None
        names.append(name)
    return names[0]
