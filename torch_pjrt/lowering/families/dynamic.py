"""Ops whose output shape depends on data, lowered with a static upper bound.

`pjrt::nonzero_padded(x, size)` returns `size` rows of indices (the nonzeros
first, then padding); the eager kernel reads the true count (a sync) and
returns a view of the first `count` rows, so one program serves every count
in a power-of-two bucket.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ..registry import lower

_lib = torch.library.Library("pjrt", "DEF")
_lib.define("nonzero_padded(Tensor self, int size) -> Tensor")


@torch.library.register_fake("pjrt::nonzero_padded", lib=_lib)
def _nonzero_padded_meta(x, size):
    return x.new_empty((size, x.dim()), dtype=torch.long)


@lower(torch.ops.pjrt.nonzero_padded.default)
def nonzero_padded(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    idx = jnp.nonzero(x, size=size, fill_value=0)
    return jnp.stack(idx, axis=1).astype(jnp.int64)
