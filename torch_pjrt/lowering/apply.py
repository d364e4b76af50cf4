"""Calling a lowering: the machinery shared by eager ops and compiled graphs.

Given an op's arguments in schema order (tensors already as arrays), cast the
promoted operands to PyTorch's computation dtype, pass the output metadata or
an RNG key if the lowering asks, and collect its results as a flat list.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..storage import dtypes
from .kinds import GENERATOR, OPT_TENSOR, SCALAR, SCALAR_LIST, TENSOR, TENSOR_LIST

_KINDS = {
    "default": ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
    "int_to_float": ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT,
    "always_bool": ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL,
    "complex_to_float": ELEMENTWISE_TYPE_PROMOTION_KIND.COMPLEX_TO_FLOAT,
    "bool_to_long": ELEMENTWISE_TYPE_PROMOTION_KIND.BOOL_TO_LONG,
    "no_opmath": ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH,
}


def promotion(spec, metas: list, out_dtype) -> dict[str, Any] | None:
    """{arg name: computation dtype} for the operands the lowering wants promoted.

    `metas` are the arguments with tensors as meta/fake tensors; `out_dtype` is the
    dtype of the op's first output (for promote="result")."""
    lowering = spec.lowering
    if lowering.promote is None:
        return None
    names = lowering.operands
    if names is None:
        names = tuple(a.name for a in spec.args
                      if a.kind in (TENSOR, OPT_TENSOR, TENSOR_LIST, SCALAR)
                      and not (spec.is_out and a.write))
    by_name = {a.name: m for a, m in zip(spec.args, metas)}
    names = tuple(n for n in names if n in by_name)  # one list may serve several overloads
    operands = []
    for n in names:
        m = by_name[n]
        if m is not None:
            operands.extend(m if isinstance(m, list) else [m])
    result = None
    if lowering.promote == "result":
        dtype = out_dtype
    elif not operands:
        return None
    else:
        dtype, result = elementwise_dtypes(*operands,
                                           type_promotion_kind=_KINDS[lowering.promote])
    compute = {n: dtypes.to_jax(dtype) for n in names}
    if spec.is_out and result is not None and result in _ROUNDED and dtype != result:
        compute[ROUND_TO] = result
    return compute


# The key in promotion()'s mapping for the dtype an out= variant's result is rounded to
# before it is written: PyTorch computes in the common dtype whatever the out= dtype is
# (float16 33000 + 33000 is inf even into a float64 out), in float32 for the half types
# (opmath), rounding the result to the common dtype.
ROUND_TO = ""
_ROUNDED = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}


def _round(results: list, dtype) -> list:
    """The opmath result rounded to the common half dtype, kept in float32: reduce_precision,
    not a convert to the half type and back, which XLA may drop as excess precision."""
    exponent, mantissa = _ROUNDED[dtype]
    return [lax.reduce_precision(r, exponent, mantissa)
            if isinstance(r, jax.Array) and r.dtype == jnp.float32 else r for r in results]


def _cast(val, dtype):
    if isinstance(val, list):
        return [_cast(x, dtype) for x in val]
    if isinstance(val, jax.Array):
        return val.astype(dtype)
    return val  # None, or a Python number (weakly typed: it takes the array's dtype)


_NUMBERS = (bool, int, float, complex)


def _as_array(v):
    """A Python number as a weakly typed 0-d array (what eager passes for a run-time value)."""
    return jnp.asarray(v) if type(v) in _NUMBERS else v


def _run_time(a, v, static: frozenset):
    """The value a lowering gets for argument `a`, whichever mode called it.

    Eager passes run-time Scalars (and numbers where a Tensor is expected) as 0-d arrays;
    a compiled graph holds them as Python constants. Both reach the lowering as arrays, so
    a lowering written against one mode works in the other; a Scalar that is static or
    equal to its schema default stays a Python value in both."""
    kind = a.kind
    if kind == TENSOR or kind == OPT_TENSOR:
        return _as_array(v)
    if kind == SCALAR:
        if type(v) not in _NUMBERS or a.name in static \
                or (type(v) is type(a.default) and v == a.default):
            return v
        return jnp.asarray(v)
    if kind == SCALAR_LIST and isinstance(v, (list, tuple)):
        return [_as_array(x) for x in v]
    return v


def flatten(result) -> list:
    """A lowering's result as a flat list in order; None stays (an undefined tensor)."""
    if isinstance(result, (tuple, list)):
        return [x for r in result for x in flatten(r)]
    return [result]


def invoke(spec, values: list, compute: dict | None, meta_structs: list | None, key=None,
           contiguous: tuple | None = None) -> list:
    """Call spec.lowering on `values` (schema order; tensors as arrays) and flatten.
    `contiguous`: whether each tensor argument is contiguous in PyTorch's eyes, for a
    lowering that asks (None where the caller cannot tell: the lowering assumes so)."""
    lowering = spec.lowering
    pos, kw = [], {}
    for a, v in zip(spec.args, values):
        if a.kind == GENERATOR or (spec.is_out and a.write):
            continue
        v = _run_time(a, v, lowering.static)
        if compute is not None and a.name in compute:
            v = _cast(v, compute[a.name])
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    if lowering.random:
        kw["key"] = key
    if lowering.wants_meta:
        kw["meta"] = meta_structs
    if lowering.wants_layout:
        kw["contiguous"] = contiguous
    results = flatten(lowering.fn(*pos, **kw))
    if compute is not None and ROUND_TO in compute:
        results = _round(results, compute[ROUND_TO])
    return results


def broadcast_cast(value, shape, dtype):
    """A lowering's result made exactly the output's shape and dtype."""
    return jnp.broadcast_to(dtypes.convert(value, dtype), shape)
