"""Custom kernels: a JAX function (or a Pallas kernel) becomes a PyTorch operator.

    @torch_pjrt.kernels.jax_op("mylib::swish", "(Tensor x, float beta) -> Tensor")
    def swish(x, beta):
        return x * jax.nn.sigmoid(beta * x)

    y = torch.ops.mylib.swish(t, 1.5)      # eager on pjrt (and CPU), torch.compile,
    y.sum().backward()                     # and autograd through jax.vjp

The function is registered in the lowering table like any ATen op, so on the
pjrt device it runs through the same executor (cached programs, fused eager)
and inside torch.compile graphs it is traced into the graph's program. On the
CPU it runs through JAX on the host, so the same op works on CPU tensors.
Tensor arguments become arrays; other arguments are passed as Python values
(static: a new value compiles a new program).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import torch

from .lowering import registry
from .storage import dtypes, transfer

__all__ = ["jax_op"]

_libs: dict[str, torch.library.Library] = {}


def _lib(ns: str) -> torch.library.Library:
    if ns not in _libs:
        _libs[ns] = torch.library.Library(ns, "FRAGMENT")
    return _libs[ns]


def _cpu_call(fn: Callable, args: tuple, kwargs: dict):
    """Run the JAX function on host copies of CPU tensors; results as CPU tensors."""
    from torch.utils._pytree import tree_map

    def arr(x):
        return transfer.to_numpy(x.detach().contiguous()) if isinstance(x, torch.Tensor) else x

    out = fn(*tree_map(arr, args), **tree_map(arr, kwargs))
    return jax.tree_util.tree_map(lambda a: transfer.from_numpy(np.asarray(a)), out)


def _fake(fn: Callable, args: tuple, kwargs: dict):
    """Output metadata from jax.eval_shape: tensors become shape/dtype structs."""
    from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

    leaves, spec = tree_flatten((args, kwargs))
    tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    device = leaves[tensors[0]].device if tensors else torch.device("meta")

    def of_tensors(*ts):
        full = list(leaves)
        for i, t in zip(tensors, ts):
            full[i] = t
        a, k = tree_unflatten(full, spec)
        return fn(*a, **k)

    structs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), dtypes.to_jax(leaves[i].dtype))
               for i in tensors]
    shapes = jax.eval_shape(of_tensors, *structs)
    out = jax.tree_util.tree_map(
        lambda s: torch.empty(s.shape, dtype=dtypes.to_torch(s.dtype), device=device), shapes)
    return tree_map(lambda x: x, out)


def jax_op(qualname: str, schema: str, *, differentiable: bool = True) -> Callable:
    """Register `fn` (a JAX function) as the PyTorch operator `qualname` with `schema`
    (its signature without the name, e.g. "(Tensor x, float beta) -> Tensor")."""
    ns, name = qualname.split("::")

    def register(fn: Callable) -> torch._ops.OpOverload:
        lib = _lib(ns)
        lib.define(name + schema)
        op = getattr(getattr(torch.ops, ns), name).default
        lib.impl(name, lambda *a, **k: _fake(fn, a, k), "Meta")
        lib.impl(name, lambda *a, **k: _cpu_call(fn, a, k), "CPU")
        registry.lower(op)(fn)
        from . import runtime

        if runtime._initialized:
            _install_device_kernel(op)
        else:
            _pending.append(op)
        if differentiable:
            _register_autograd(op, fn, ns, name, schema)
        return op

    return register


_pending: list = []


def _install_device_kernel(op) -> None:
    from .eager import dispatch  # not at import: the runtime installs the dispatcher first

    dispatch.register_kernel(op)


def install_pending() -> None:
    """Called once the runtime starts: device kernels for ops registered before it."""
    while _pending:
        _install_device_kernel(_pending.pop())


def _split_args(schema: str) -> list[str]:
    """The argument declarations of "(Tensor x, int[] dims=[0, 1]) -> Tensor"."""
    inner = schema[schema.index("(") + 1: schema.rindex(")", 0, schema.index("->"))]
    out, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [a for a in out + [cur.strip()] if a]


def _register_autograd(op, fn: Callable, ns: str, name: str, schema: str) -> None:
    """Backward through jax.vjp, itself an operator (so it runs on the device too)."""
    decls = _split_args(schema)
    is_tensor = [d.split()[0] == "Tensor" for d in decls]
    static_decls = [d for d, t in zip(decls, is_tensor) if not t]
    n_out = len(op._schema.returns)

    def vjp_fn(primals, grads, *statics):
        def of_tensors(*tensors):
            ts, ss = iter(tensors), iter(statics)
            return fn(*[next(ts) if t else next(ss) for t in is_tensor])

        _, pullback = jax.vjp(of_tensors, *primals)
        return list(pullback(grads[0] if n_out == 1 else tuple(grads)))

    back_schema = "(" + ", ".join(["Tensor[] primals", "Tensor[] grads", *static_decls]) + \
        ") -> Tensor[]"
    back = jax_op(f"{ns}::{name}_jax_backward", back_schema, differentiable=False)(vjp_fn)

    def setup_context(ctx, inputs, output):
        ctx.statics = [v for v, t in zip(inputs, is_tensor) if not t]
        ctx.save_for_backward(*[v for v, t in zip(inputs, is_tensor) if t])

    def backward(ctx, *grads):
        tensor_grads = iter(back(list(ctx.saved_tensors), [g.contiguous() for g in grads],
                                 *ctx.statics))
        return tuple(next(tensor_grads) if t else None for t in is_tensor)

    torch.library.register_autograd(op, backward, setup_context=setup_context)
