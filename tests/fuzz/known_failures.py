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


KNOWN: dict[str, Known] = {
    "dtype not implemented by the CPU kernel": Known(
        "a dtype the CPU kernel does not implement (NotImplementedError): the lowering "
        "computes it (as CUDA's kernels would), or JAX rejects it with its own "
        "TypeError/ValueError; eager/meta.py's cpu_check leaves NotImplementedError alone "
        "on purpose",
        r"CPU raised NotImplementedError"),
    "index check on an empty result": Known(
        "an out-of-range index that selects no element (the indexed tensor is empty): the "
        "CPU checks only the elements it writes; the device check rejects it",
        r"(pjrt raised IndexError \(index out of range for dimension|reading it raised "
        r"IndexError: index out of range for dimension)"),
    "resize keeps the storage": Known(
        "an out= or resize_ that grows a tensor gives it a new storage on pjrt; the CPU grows "
        "the same storage, which its other views keep sharing",
        r"\.(storage|base|same): pjrt ", EAGER, r"resize_|out="),
    "cat into its input, after the error": Known(
        "torch.cat(..., out=x) of x itself: both raise (the overlap), but the CPU has resized "
        "x first, leaving it larger and partly uninitialized; pjrt leaves x as it was",
        r"^\w+\.(shape|values|stride|storage|base|same): pjrt ", EAGER,
        r"torch\.cat\(\[(\w+), \1\], out=\1\)"),
    "scalar value conversion": Known(
        "a Python number that does not fit the dtype it is converted to (fill_ of an "
        "integer tensor with a complex number): the CPU kernel checks the value; pjrt keys "
        "its programs by the number's type, and checks the value only at the first call of "
        "a signature (eager/meta.py cpu_check), not at later ones",
        r"CPU raised RuntimeError \(value cannot be converted to type \w+ without overflow"),
    "meta function stricter than the CPU kernel": Known(
        "PyTorch's meta function (its Python reference) rejects a call its CPU kernel runs: "
        "masked_fill_ of a bool tensor with a complex value, nansum of integers into a bool "
        "out=, abs of a complex tensor into a complex out=. pjrt raises the meta function's "
        "error; no value is wrong",
        r"CPU ran, pjrt raised RuntimeError \((could not convert to type <class '\w+'> "
        r"without overflow|Attempting to cast from|Expected out tensor to have dtype "
        r"[\w.]+ but got)", EAGER),
    "exact overlap check": Known(
        "an out= tensor that partly overlaps the input through a strided view: the CPU's "
        "overlap check gives up on non-contiguous tensors and writes in its loop order; "
        "pjrt's check is exact and raises the CPU's own overlap error",
        r"CPU ran, pjrt raised RuntimeError \([\w.]+: unsupported operation: some elements "
        r"of the input tensor and the written-to tensor refer to a single memory location",
        EAGER),
    "index_select of bool out of range": Known(
        "index_select of a bool tensor with an index out of range: the CPU's bool kernel "
        "raises RuntimeError (INDICES element is out of DATA bounds), pjrt IndexError, as "
        "the CPU does for every other dtype",
        r"CPU raised RuntimeError \(INDICES element is out of DATA bounds.*pjrt raised "
        r"IndexError", EAGER),
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
