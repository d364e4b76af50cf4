"""Fake implementations from `jax.eval_shape`, for operators whose author registered none.

torch.compile, the executor's checks and `opcheck` need an op's output shapes and dtypes
without running it. Where the author gave no `register_fake`, the JAX function's own
output shapes serve, as contiguous tensors (static shapes only: with symbolic sizes the
author's fake implementation is needed).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import torch
from torch.utils import _pytree as pytree

from ..storage import dtypes
from . import library


def outputs_of(op: library.OpOverload, results: list):
    """The op's return value from the flat list of its new tensors, by its schema: None,
    a tensor, a tuple, or a list for a Tensor[] return."""
    returns = op._schema.returns
    if not returns:
        return None
    if len(returns) == 1:
        if isinstance(returns[0].type, torch.ListType):
            return list(results)
        return results[0]
    return tuple(results)


def call_on_tensors(fn: Callable, args: tuple, kwargs: dict, convert: Callable) -> list:
    """`fn` called with every tensor in (args, kwargs) replaced by `convert(tensor)`; its
    results as a flat list."""
    converted = pytree.tree_map_only(torch.Tensor, convert, (args, kwargs))
    return jax.tree_util.tree_leaves(fn(*converted[0], **converted[1]))


def outputs_on_meta(op: library.OpOverload, args: tuple, kwargs: dict) -> list:
    """The op's outputs (flat, tensors or None) by its fake implementation, called on meta
    tensors shaped like the arrays in (args, kwargs)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not op._schema.returns:
        return []

    def meta(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return torch.empty(tuple(x.shape), dtype=dtypes.to_torch(x.dtype), device="meta")
        return x

    converted = jax.tree_util.tree_map(meta, (args, kwargs), is_leaf=lambda x: x is None)
    with unset_fake_temporarily():
        out = op(*converted[0], **converted[1])
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor) or x is None]


def from_jax(op: library.OpOverload, fn: Callable) -> Callable:
    """A fake implementation of `op` computed by jax.eval_shape of `fn` (which returns the
    new values of the mutated arguments first, then the outputs)."""
    n_mutated = len(library.mutated_args(op))

    def fake(*args, **kwargs):
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("meta")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

        def of_arrays(*arrays):
            full = list(leaves)
            for i, a in zip(positions, arrays):
                full[i] = a
            a, k = pytree.tree_unflatten(full, spec)
            return fn(*a, **k)

        structs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), dtypes.to_jax(leaves[i].dtype))
                   for i in positions]
        shapes = jax.tree_util.tree_leaves(jax.eval_shape(of_arrays, *structs))
        results = [torch.empty(s.shape, dtype=dtypes.to_torch(s.dtype), device=device)
                   for s in shapes[n_mutated:]]
        return outputs_of(op, results)

    return fake


def ensure(op: library.OpOverload, fn: Callable) -> None:
    """Register `from_jax(op, fn)` as `op`'s fake implementation if it has none."""
    if library.has_fake(op):
        return
    opdef = library.custom_op_def(op)
    if opdef is not None:
        opdef.register_fake(from_jax(op, fn))
    else:
        torch.library.register_fake(library.qualname(op), from_jax(op, fn),
                                    lib=library.library(op.namespace, "FRAGMENT"))
