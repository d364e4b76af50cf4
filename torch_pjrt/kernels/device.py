"""An operator's pjrt kernel: its JAX function in the lowering table, served by the executor.

Registered like any ATen op's lowering, the function runs through the same machinery
in every mode: one cached program per signature in strict mode, recorded into the
pending graph in fused mode, traced into the graph's program under torch.compile.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import torch

from .. import runtime
from ..lowering import apply, registry
from ..lowering.kinds import GENERATOR, SCALAR
from ..lowering.kinds import of as kind_of
from ..runtime import compile_cache
from ..storage import dtypes
from . import fake, library, pallas


def install(op: library.OpOverload, fn: Callable) -> None:
    """Serve `op` on pjrt tensors with `fn`. Tensor arguments reach it as arrays, every
    other argument as its Python value (static: a new value compiles a new program),
    keyword-only arguments as keywords. It returns the new values of the arguments the
    op mutates (schema order), then the op's outputs."""
    if registry.get(op) is not None:
        raise ValueError(f"{op} already has a pjrt kernel "
                         f"({registry.get(op).fn.__module__}.{registry.get(op).fn.__qualname__})")
    args = op._schema.arguments
    statics = [a.name for a in args if kind_of(a.type) == SCALAR]
    compile_cache.note_kernel_source(fn)  # an edited kernel: new programs
    registry.lower(op, static=statics)(_checked(op, pallas.interpreting(fn)))
    if runtime._initialized:  # else the executor's start registers every lowered op
        from ..eager import dispatch

        dispatch.register_kernel(op)


def _checked(op: library.OpOverload, fn: Callable) -> Callable:
    """`fn` with its results checked against the op's fake implementation (run on meta
    tensors when the function is traced): a JAX function returning another shape or
    dtype would otherwise be broadcast and cast silently."""
    args = op._schema.arguments
    passed = [a for a in args if kind_of(a.type) != GENERATOR]
    mutated = []  # (name, positional index or None) of each written argument
    position = 0
    for a in passed:
        if a.alias_info is not None and a.alias_info.is_write:
            mutated.append((a.name, None if a.kwarg_only else position))
        position += not a.kwarg_only

    def lowering(*args, **kwargs):
        results = apply.flatten(fn(*args, **kwargs))
        expected = [kwargs.get(name) if pos is None else args[pos] for name, pos in mutated]
        expected += fake.outputs_on_meta(op, args, kwargs)
        if len(results) != len(expected):
            raise RuntimeError(
                f"{op}: its JAX function returned {len(results)} arrays; expected "
                f"{len(expected)} ({len(mutated)} new values of the mutated arguments, "
                f"then {len(expected) - len(mutated)} outputs)")
        for i, (r, e) in enumerate(zip(results, expected)):
            if e is None or r is None:
                continue
            if tuple(jnp.shape(r)) != tuple(e.shape) or jnp.result_type(r) != _dtype(e):
                what = f"the new value of {mutated[i][0]!r}" if i < len(mutated) else \
                    f"output {i - len(mutated)}"
                raise RuntimeError(
                    f"{op}: its JAX function returned {_describe(r)} for {what}; the op's "
                    f"fake implementation (or the argument) says {_describe(e)}")
        return results

    lowering.__name__ = getattr(fn, "__name__", "jax_kernel")
    lowering.__qualname__ = getattr(fn, "__qualname__", lowering.__name__)
    lowering.__module__ = getattr(fn, "__module__", __name__)
    return lowering


def _dtype(x):
    return dtypes.to_jax(x.dtype) if isinstance(x, torch.Tensor) else jnp.result_type(x)


def _describe(x) -> str:
    return f"{jnp.dtype(_dtype(x)).name}{list(x.shape)}"
