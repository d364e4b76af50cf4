"""Shared helpers for lowering families."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import lower

aten = torch.ops.aten


def _elementwise(fn: Callable) -> Callable:
    def lowering(*operands):
        return fn(*operands)

    lowering.__name__ = getattr(fn, "__name__", "elementwise")
    return lowering


def register_each(table: dict) -> None:
    """Register {op: (jax_fn, promotion)}: the lowering applies jax_fn to the operands."""
    for op, (fn, promote) in table.items():
        lower(op, promote=promote)(_elementwise(fn))
