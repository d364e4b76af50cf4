"""Shape ops that move data: cat, stack, padding, flips, rolls, triangles, repeats."""

from __future__ import annotations

import jax.numpy as jnp

from ..registry import lower
from ._ops import aten


@lower(aten.cat.default, promote="result")
def cat(tensors, dim=0):
    # PyTorch skips legacy empty 1-D tensors of shape (0,) when concatenating.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    return jnp.concatenate(kept, axis=dim % kept[0].ndim)


@lower(aten.stack.default, promote="result")
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim % (tensors[0].ndim + 1))


@lower(aten.constant_pad_nd.default, promote="result", operands=("self", "value"))
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    # Negative padding crops.
    lo = [max(-a, 0) for a, _ in widths]
    hi = [x.shape[d] - max(-b, 0) for d, (_, b) in enumerate(widths)]
    x = x[tuple(slice(a, b) for a, b in zip(lo, hi))]
    return jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], constant_values=value)


@lower(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims)) if x.ndim else x


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)
