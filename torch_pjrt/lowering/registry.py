"""The lowering table: ATen op overload -> JAX function. One table for every mode.

A lowering is a small pure function `(*arrays, **params) -> jax.Array(s)`,
registered with `@lower(aten.op.overload, ...)` for every overload it covers.
Type promotion, in-place and `out=` variants, views and output layout belong
to the machinery around it (torch_pjrt.eager.executor), written once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

OpOverload = torch._ops.OpOverload

# How the machinery casts an op's operands before calling the lowering, as in
# torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND (by name), or None.
PROMOTIONS = ("default", "int_to_float", "always_bool", "complex_to_float", "bool_to_long",
              "no_opmath", "result")


@dataclass(frozen=True)
class Lowering:
    op: OpOverload
    fn: Callable
    promote: str | None = None
    operands: tuple[str, ...] | None = None  # args to promote; None: all tensor/Scalar args
    static: frozenset[str] = frozenset()  # Scalar args passed as Python values
    random: bool = False  # fn takes key= (a JAX PRNG key)
    wants_meta: bool = False  # fn takes meta= (the output ShapeDtypeStructs)
    eager: bool = True  # False: only compiled graphs use it (views are metadata in eager)
    dynamic: frozenset[str] = frozenset()  # float/int args passed at run time, like Scalars
    products: bool = False  # fn computes matrix products (runtime/cpu_kernels.py looks at those)
    # fn takes contiguous= (for each tensor argument in schema order, whether PyTorch sees it
    # contiguous: the few ops whose results PyTorch defines by the input's strides)
    wants_layout: bool = False
    # random ops that draw only where this static argument is nonzero (a dropout
    # probability): with it zero the program draws nothing (eager/op_cache.py: quick)
    draws_if: str | None = None


_TABLE: dict[OpOverload, Lowering] = {}


def lower(
    *ops: OpOverload,
    promote: str | None = None,
    operands: Iterable[str] | None = None,
    static: Iterable[str] = (),
    random: bool = False,
    eager: bool = True,
    dynamic: Iterable[str] = (),
    products: bool = False,
    draws_if: str | None = None,
) -> Callable[[Callable], Callable]:
    """Register `fn` as the lowering of each listed overload.

    Non-tensor arguments are static (part of the program's key) except Scalars, which
    are run-time inputs; `static=` makes Scalars static, `dynamic=` makes float or int
    arguments run-time inputs (an optimizer's lr, so a scheduler does not recompile).
    `products=True` marks a lowering that computes matrix products: on XLA:CPU only the
    programs of such ops are searched for products to hand to MKL (runtime/cpu_kernels.py).
    `draws_if=` names the static argument without which a `random=True` op draws nothing
    (SDPA's dropout_p: attention at inference takes a key and draws no bits)."""
    if promote is not None and promote not in PROMOTIONS:
        raise ValueError(f"lower: unknown promotion {promote!r}; accepted: {PROMOTIONS}")

    def register(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters
        wants_meta, wants_layout = "meta" in params, "contiguous" in params
        for op in ops:
            if not isinstance(op, OpOverload):
                raise TypeError(f"lower: {op!r} is not an OpOverload (name the overload, "
                                "e.g. aten.add.Tensor)")
            if op in _TABLE:
                raise ValueError(f"lower: {op} already has a lowering "
                                 f"({_TABLE[op].fn.__module__}.{_TABLE[op].fn.__name__})")
            _TABLE[op] = Lowering(
                op, fn, promote, tuple(operands) if operands is not None else None,
                frozenset(static), random, wants_meta, eager, frozenset(dynamic), products,
                wants_layout, draws_if,
            )
        return fn

    return register


def get(op: OpOverload) -> Lowering | None:
    return _TABLE.get(op)


def table() -> dict[OpOverload, Lowering]:
    return dict(_TABLE)


def load_all() -> None:
    """Import every lowering family so the table is complete."""
    from . import families  # noqa: F401
