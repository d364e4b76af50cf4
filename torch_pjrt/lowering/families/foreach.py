"""The _foreach_* ops the optimizers use: one program for a whole list of tensors."""

from __future__ import annotations

import jax.numpy as jnp

from ..registry import lower
from ._ops import aten


def _pairs(xs, ys):
    return ys if isinstance(ys, (list, tuple)) else [ys] * len(xs)


@lower(aten._foreach_add.List, aten._foreach_add.Scalar, aten._foreach_add.ScalarList,
       aten._foreach_add.Tensor)
def foreach_add(xs, ys, *, alpha=1):
    return [x + (alpha * y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_sub.List, aten._foreach_sub.Scalar, aten._foreach_sub.ScalarList)
def foreach_sub(xs, ys, *, alpha=1):
    return [x - (alpha * y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_mul.List, aten._foreach_mul.Scalar, aten._foreach_mul.ScalarList,
       aten._foreach_mul.Tensor)
def foreach_mul(xs, ys):
    return [(x * y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_div.List, aten._foreach_div.Scalar, aten._foreach_div.ScalarList,
       aten._foreach_div.Tensor)
def foreach_div(xs, ys):
    return [(x / y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_addcmul.Scalar, aten._foreach_addcmul.ScalarList,
       aten._foreach_addcmul.Tensor)
def foreach_addcmul(xs, t1, t2, scalars=1):
    return [(x + v * a * b).astype(x.dtype) for x, a, b, v in
            zip(xs, t1, t2, _scalar_list(scalars, len(xs)))]


@lower(aten._foreach_addcdiv.Scalar, aten._foreach_addcdiv.ScalarList,
       aten._foreach_addcdiv.Tensor)
def foreach_addcdiv(xs, t1, t2, scalars=1):
    return [(x + v * a / b).astype(x.dtype) for x, a, b, v in
            zip(xs, t1, t2, _scalar_list(scalars, len(xs)))]


def _scalar_list(scalars, n):
    if isinstance(scalars, (list, tuple)):
        return scalars
    if hasattr(scalars, "shape") and scalars.ndim == 1:
        return [scalars[i] for i in range(n)]
    return [scalars] * n


@lower(aten._foreach_lerp.Scalar, aten._foreach_lerp.List)
def foreach_lerp(xs, ends, weight):
    ws = _pairs(xs, weight)
    return [(x + w * (e - x)).astype(x.dtype) for x, e, w in zip(xs, ends, ws)]


@lower(aten._foreach_sqrt.default)
def foreach_sqrt(xs):
    return [jnp.sqrt(x) for x in xs]


@lower(aten._foreach_neg.default)
def foreach_neg(xs):
    return [-x for x in xs]


@lower(aten._foreach_maximum.List, aten._foreach_maximum.Scalar)
def foreach_maximum(xs, ys):
    return [jnp.maximum(x, y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_tensor(base, exponents):
    return [jnp.power(base, e).astype(e.dtype) for e in exponents]


@lower(aten._foreach_pow.List, aten._foreach_pow.Scalar, aten._foreach_pow.ScalarList)
def foreach_pow(xs, ys):
    return [jnp.power(x, y).astype(x.dtype) for x, y in zip(xs, _pairs(xs, ys))]


@lower(aten._foreach_reciprocal.default)
def foreach_reciprocal(xs):
    return [1 / x for x in xs]


@lower(aten._foreach_abs.default)
def foreach_abs(xs):
    return [jnp.abs(x) for x in xs]


@lower(aten._foreach_zero.default)
def foreach_zero(xs):
    return [jnp.zeros_like(x) for x in xs]


@lower(aten._foreach_copy.default)
def foreach_copy(xs, srcs, non_blocking=False):
    return [jnp.broadcast_to(s, x.shape).astype(x.dtype) for x, s in zip(xs, srcs)]


@lower(aten._foreach_norm.Scalar)
def foreach_norm(xs, ord=2, dtype=None):
    out = []
    for x in xs:
        a = jnp.abs(x)
        if ord == 2:
            out.append(jnp.sqrt(jnp.sum(a * a)))
        elif ord == float("inf"):
            out.append(jnp.max(a) if a.size else jnp.zeros((), a.dtype))
        else:
            out.append(jnp.sum(a**ord) ** (1.0 / ord))
    return out
