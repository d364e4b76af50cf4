"""A warning (once per program) when the same code keeps compiling for new inputs.

Programs are specialized to their input shapes (and static arguments); a loop
whose shapes change every iteration compiles every iteration. After LIMIT
distinct signatures of one program this says which input changed, and how.
"""

from __future__ import annotations

import re
import warnings

from .. import counters
from ..runtime import watch

LIMIT = 8

_seen: dict = {}  # code -> {signature: None} (insertion ordered)
_warned: set = set()


def describe(old: tuple, new: tuple, unit: str = "input") -> str:
    """Which positions of two signatures differ, as '<unit> i: a -> b'."""
    diffs = [f"{unit} {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(old, new)) if a != b]
    if len(old) != len(new):
        diffs.append(f"{len(old)} -> {len(new)} {unit}s")
    return "; ".join(diffs[:3]) or "static arguments"


def note(code, signature: tuple, name: str, kind: str, unit: str = "input",
         advice: str | None = None) -> bool:
    """Record that the program for `code` (anything hashable naming it) runs with
    `signature`; warn once past LIMIT of them, calling it `name` (and `advice`, if given,
    replacing the default advice). `kind` ("fused" graph or "compiled" graph) splits the
    `recompiles` counter: `recompiles.fused`, `recompiles.compiled`. True where `code` has
    run with another signature too (its shapes change: fused eager then expects no reuse
    of what it compiles for this one, eager/tiers.py)."""
    seen = _seen.setdefault(code, {})
    if signature in seen:
        return len(seen) > 1
    previous = next(reversed(seen)) if seen else None
    seen[signature] = None
    if len(seen) > 1:
        counters.count("recompiles")
        counters.count(f"recompiles.{kind}")
        watch.recompiled(name, describe(previous, signature, unit), kind=kind)
    if len(seen) > LIMIT and code not in _warned:
        _warned.add(code)
        warnings.warn(
            f"pjrt: {name} has been compiled for {len(seen)} different inputs; the last "
            f"change was {describe(previous, signature, unit)}. " + (advice or (
                "Each new shape compiles a new program: pad inputs to a few fixed sizes to "
                "avoid recompiling.")), stacklevel=3)
    return len(seen) > 1


_op_signatures: dict[str, str] = {}  # op -> the signature it last compiled for
_INPUT = re.compile(r"\w+\[[^\]]*\]")  # 'float32[8, 3]' in 'aten.add.Tensor(float32[8, 3])'


def note_op(op: str, signature: str) -> None:
    """An op's program compiles (strict mode) for `signature`; one that compiled before
    for another is noted for the report, not counted or warned about: a model calls one
    op with many shapes, which is no reason to change it."""
    previous = _op_signatures.get(op)
    _op_signatures[op] = signature
    if previous is not None and previous != signature:
        old, new = tuple(_INPUT.findall(previous)), tuple(_INPUT.findall(signature))
        watch.recompiled(op, describe(old, new), kind="op")
