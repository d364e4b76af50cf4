"""Shared helpers for lowering families."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import torch

from ..registry import lower

aten = torch.ops.aten


def is_int(x) -> bool:
    """An integer or bool array (PyTorch's integral types)."""
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def zero(x):
    """A 0-d zero of x's dtype (keeps jnp.where from promoting)."""
    return jnp.zeros((), x.dtype)


def const(value, x):
    """`value` as an array of x's dtype."""
    return jnp.asarray(value, x.dtype)


def _elementwise(fn: Callable) -> Callable:
    def lowering(*operands):
        return fn(*operands)

    lowering.__name__ = getattr(fn, "__name__", "elementwise")
    return lowering


def register_each(table: dict) -> None:
    """Register {op: (jax_fn, promotion)}: the lowering applies jax_fn to the operands."""
    for op, (fn, promote) in table.items():
        lower(op, promote=promote)(_elementwise(fn))
