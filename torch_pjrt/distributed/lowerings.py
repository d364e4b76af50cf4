"""Lowerings of the functional collectives (`_c10d_functional.*`) for compiled graphs.

A compiled graph with collectives runs as one SPMD program over its process group's
devices (compiled.py); inside it these lowerings are XLA collectives over the group's
mesh axis. Eager calls of the same ops keep PyTorch's own kernels, which call the
process group (process_group.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..lowering.registry import lower
from . import collectives
from .collectives import AXIS

c10d = torch.ops._c10d_functional

# The group size of the SPMD program being traced (set by compiled.py around tracing).
_size: list[int] = []


def group_size() -> int:
    if not _size:
        raise RuntimeError("pjrt: a functional collective outside the SPMD program of a "
                           "compiled graph")
    return _size[-1]


def _op(reduce_op: str) -> str:
    return reduce_op.upper()


@lower(c10d.all_reduce.default, eager=False)
def all_reduce(input, reduce_op, group_name):
    return collectives.reduce_all(input, _op(reduce_op), group_size())


@lower(c10d.all_reduce_coalesced.default, eager=False)
def all_reduce_coalesced(inputs, reduce_op, group_name):
    return [collectives.reduce_all(x, _op(reduce_op), group_size()) for x in inputs]


@lower(c10d.all_gather_into_tensor.default, eager=False)
def all_gather_into_tensor(input, group_size_, group_name):
    return lax.all_gather(input, AXIS, axis=0, tiled=True)


@lower(c10d.all_gather_into_tensor_coalesced.default, eager=False)
def all_gather_into_tensor_coalesced(inputs, group_size_, group_name):
    return [lax.all_gather(x, AXIS, axis=0, tiled=True) for x in inputs]


def _reduce_scatter(x, reduce_op: str):
    n = group_size()
    op = _op(reduce_op)
    if op in (collectives.SUM, collectives.AVG):
        out = lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
        return collectives._divide(out, n) if op == collectives.AVG else out
    rows = lax.all_to_all(x.reshape(n, -1), AXIS, 0, 0, tiled=True)
    return collectives._reduce_rows(rows, op).reshape((x.shape[0] // n,) + x.shape[1:])


@lower(c10d.reduce_scatter_tensor.default, eager=False)
def reduce_scatter_tensor(input, reduce_op, group_size_, group_name):
    return _reduce_scatter(input, reduce_op)


@lower(c10d.reduce_scatter_tensor_coalesced.default, eager=False)
def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size_, group_name):
    return [_reduce_scatter(x, reduce_op) for x in inputs]


@lower(c10d.all_to_all_single.default, eager=False)
def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    n = group_size()
    rows = input.shape[0]
    splits = {tuple(s) for s in (output_split_sizes, input_split_sizes) if s}
    if any(len(set(s)) > 1 for s in splits) or rows % n:
        raise NotImplementedError("pjrt: all_to_all_single with uneven splits in a compiled "
                                  "graph")
    parts = input.reshape((n, rows // n) + input.shape[1:])
    return lax.all_to_all(parts, AXIS, 0, 0, tiled=True).reshape(input.shape)


@lower(c10d.broadcast.default, eager=False)
def broadcast(input, src, group_name):
    return collectives._from_root(input, src)


@lower(c10d.wait_tensor.default, eager=False)
def wait_tensor(tensor):
    return jnp.asarray(tensor)


OPS = frozenset({c10d.all_reduce.default, c10d.all_reduce_coalesced.default,
                 c10d.all_gather_into_tensor.default,
                 c10d.all_gather_into_tensor_coalesced.default,
                 c10d.reduce_scatter_tensor.default, c10d.reduce_scatter_tensor_coalesced.default,
                 c10d.all_to_all_single.default, c10d.broadcast.default})
