"""Block sizes and padding shared by the shipped Pallas kernels, and Pallas itself."""

from __future__ import annotations

import importlib

import jax.numpy as jnp

NAMESPACE = "pjrt_kernels"


class _Pallas:
    """jax.experimental.pallas, imported where a kernel first uses it (when it traces): its
    import is 0.1 s of every process's start, most of which never run these kernels (the
    examples register their operators at start)."""

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("jax.experimental.pallas"), name)


pl = _Pallas()


def block(size: int, preferred: int) -> int:
    """The block length for an axis of `size`: `preferred`, or the whole axis when it is
    shorter (rounded up to a multiple of 8, the row tile every Pallas backend accepts)."""
    return preferred if size >= preferred else max(8, -(-size // 8) * 8)


def pad_to(x, axis: int, multiple: int, value=0):
    """`x` padded at the end of `axis` to a multiple of `multiple` (unchanged if it is one)."""
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, extra)
    return jnp.pad(x, pads, constant_values=value)
