"""Matrix products: mm, bmm, addmm, baddbmm, mv, dot and friends."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..registry import lower
from ._ops import aten

_PRECISION = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}


def precision():
    """XLA dot precision from torch.get_float32_matmul_precision() (PyTorch: exact fp32)."""
    return _PRECISION[torch.get_float32_matmul_precision()]


def matmul(a, b):
    """a @ b in the operands' dtype, accumulated in at least float32."""
    out = a.dtype
    acc = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else None
    return jnp.matmul(a, b, precision=precision(), preferred_element_type=acc).astype(out)


@lower(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default, promote="default")
def mm(a, b):
    return matmul(a, b)


@lower(aten.vdot.default, promote="default")
def vdot(a, b):
    return matmul(jnp.conj(a), b)


@lower(aten.addmm.default, aten.baddbmm.default, aten.addmv.default, promote="default",
       static=("beta", "alpha"))
def addmm(bias, a, b, *, beta=1, alpha=1):
    prod = matmul(a, b)
    if not isinstance(alpha, int) or alpha != 1:
        prod = prod * alpha
    if isinstance(beta, int) and beta == 0:
        return prod  # PyTorch ignores bias (even NaN) when beta is 0
    if not isinstance(beta, int) or beta != 1:
        bias = bias * beta
    return bias + prod


@lower(aten.addbmm.default, promote="default", static=("beta", "alpha"))
def addbmm(bias, a, b, *, beta=1, alpha=1):
    prod = jnp.sum(matmul(a, b), axis=0) * alpha
    if isinstance(beta, int) and beta == 0:
        return prod
    return bias * beta + prod


@lower(aten.outer.default, promote="default")
def outer(a, b):
    return a[:, None] * b[None, :]
