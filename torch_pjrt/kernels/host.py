"""A JAX function as an operator's CPU kernel: run by JAX on host copies of CPU tensors.

For `jax_op`, whose operators have no PyTorch implementation of their own: the same
function then serves CPU tensors (through JAX's CPU backend, outside torch-pjrt) and
pjrt tensors (through the executor).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..storage import transfer
from . import fake, library


def cpu_kernel(op: library.OpOverload, fn: Callable) -> Callable:
    """A CPU kernel of `op` running `fn`; mutated arguments are written in place."""
    mutated = library.mutated_args(op)
    arg_names = [a.name for a in op._schema.arguments]
    n_positional = sum(1 for a in op._schema.arguments if not a.kwarg_only)

    def kernel(*args, **kwargs):
        results = fake.call_on_tensors(
            fn, args, kwargs, lambda t: transfer.to_numpy(t.detach().contiguous()))
        results = [transfer.from_numpy(np.asarray(r)) for r in results]
        for i, new in zip(mutated, results):
            target = args[i] if i < n_positional else kwargs[arg_names[i]]
            target.copy_(new)
        return fake.outputs_of(op, results[len(mutated):])

    return kernel


def register(op: library.OpOverload, fn: Callable) -> None:
    library.library(op.namespace).impl(library.name_in_namespace(op), cpu_kernel(op, fn), "CPU")

