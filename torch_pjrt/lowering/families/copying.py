"""Copies, fills and dtype conversions."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ...storage import dtypes
from ..apply import broadcast_cast
from ..registry import lower

aten = torch.ops.aten


@lower(aten.copy.default)
def copy(self, src, non_blocking=False):
    return broadcast_cast(src, self.shape, self.dtype)


@lower(aten.clone.default)
def clone(self, *, memory_format=None):
    return self


@lower(aten._to_copy.default)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    return self if dtype is None else dtypes.convert(self, dtypes.to_jax(dtype))


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    return broadcast_cast(value, self.shape, self.dtype)


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)
