"""Autograd through `jax.vjp`, for operators whose author registered no autograd formula.

The backward is an operator of its own (`pjrt_kernels::vjp_<ns>_<name>_<overload>`) with
a JAX lowering, so it runs on the device like any op, in every mode, and appears as one
node in torch.compile's backward graph. It differentiates the op's JAX function with
respect to its floating-point and complex tensor arguments; other arguments get no
gradient. Pallas calls have no JAX derivative: give such an op a backward kernel with
`register_autograd` (docs/custom-kernels.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._library import autograd as torch_autograd
from torch.utils import _pytree as pytree

from ..lowering import apply
from . import autograd_kernel, device, host, library

NAMESPACE = "pjrt_kernels"


def applies(op: library.OpOverload) -> bool:
    """Whether the vjp can serve `op`: a functional schema (no mutated argument, no view)
    that returns tensors."""
    schema = op._schema
    return (not library.mutated_args(op) and bool(schema.returns)
            and all(r.alias_info is None for r in schema.returns))


def install(op: library.OpOverload, fn: Callable, dispatch_key: str) -> library.OpOverload:
    """Register autograd for `op` at `dispatch_key` ("AutogradPrivateUse1": pjrt tensors
    alone; "Autograd": every device), backward through jax.vjp of `fn` unless the author
    registers a formula of their own. Returns the backward operator."""
    backward_op = _define_backward(op, fn)
    formula = _Formula(op, backward_op)
    impl = torch_autograd.make_autograd_impl(op, formula)
    if dispatch_key != "AutogradPrivateUse1":
        library.library(op.namespace).impl(library.name_in_namespace(op), impl, dispatch_key,
                                           with_keyset=True)
    autograd_kernel.install(op, impl)  # pjrt tensors: Python only where gradients are recorded
    return backward_op


class _Formula:
    """The autograd formula as torch's make_autograd_impl reads it, at every call: the one
    the author gave custom_op's register_autograd (also after this registration), else
    the vjp."""

    def __init__(self, op: library.OpOverload, backward_op: library.OpOverload):
        self.opdef = library.custom_op_def(op)
        self.backward_op = backward_op

    def _authors(self) -> bool:
        return self.opdef is not None and self.opdef._backward_fn is not None

    @property
    def _backward_fn(self):
        return self.opdef._backward_fn if self._authors() else self._vjp_backward

    @property
    def _setup_context_fn(self):
        return self.opdef._setup_context_fn if self._authors() else _save_inputs

    def _vjp_backward(self, ctx, *grads):
        args, kwargs = _restore_inputs(ctx)
        flat_grads = pytree.tree_leaves(grads, is_leaf=lambda g: g is None)
        results = iter(self.backward_op(flat_grads, *args, **kwargs))

        def grad_of(x):
            if isinstance(x, (list, tuple)):
                return [grad_of(t) for t in x]
            return next(results) if _differentiable(x) else None

        return tuple(grad_of(a) for a in args)


def _differentiable(x) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _save_inputs(ctx, inputs, output, keyword_only_inputs=None):
    leaves, spec = pytree.tree_flatten((tuple(inputs), keyword_only_inputs or {}))
    tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    ctx.save_for_backward(*[leaves[i] for i in tensors])
    ctx.pjrt_inputs = ([None if isinstance(x, torch.Tensor) else x for x in leaves], spec,
                       tensors)


def _restore_inputs(ctx) -> tuple[tuple, dict]:
    leaves, spec, tensors = ctx.pjrt_inputs
    leaves = list(leaves)
    for i, t in zip(tensors, ctx.saved_tensors):
        leaves[i] = t
    return pytree.tree_unflatten(leaves, spec)


# ------------------------------------------------------------------ the backward op
def _define_backward(op: library.OpOverload, fn: Callable) -> library.OpOverload:
    ns, name = library.qualname(op).split("::")
    back_name = f"vjp_{ns}_{name}_{op._overloadname}"
    schema = f"(Tensor?[] grads, {', '.join(_declarations(op))}) -> Tensor[]"
    lib = library.library(NAMESPACE, "FRAGMENT")
    lib.define(back_name + schema)
    back = getattr(getattr(torch.ops, NAMESPACE), back_name).default
    lowering = _vjp_lowering(fn)
    torch.library.register_fake(library.qualname(back), _backward_fake, lib=lib)
    host.register(back, lowering)
    device.install(back, lowering)
    return back


def _declarations(op: library.OpOverload) -> list[str]:
    """The op's argument declarations as its schema prints them, alias annotations
    dropped ("Tensor(a) x" -> "Tensor x"), "*" kept before keyword-only ones."""
    text = str(op._schema)
    inner = text[text.index("(") + 1: text.rindex(" -> ")].rstrip()[:-1]
    out, depth, current = [], 0, ""
    for ch in inner:
        depth += 1 if ch in "[(" else -1 if ch in "])" else 0
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    out.append(current.strip())
    return [re.sub(r"^Tensor\([^)]*\)", "Tensor", d) for d in out if d]


def _backward_fake(grads, *args, **kwargs):
    return [torch.empty(t.shape, dtype=t.dtype, device=t.device)
            for t in pytree.tree_leaves((args, kwargs)) if _differentiable(t)]


def _vjp_lowering(fn: Callable) -> Callable:
    """The backward op's JAX function: the cotangents of the differentiable inputs."""

    def backward(grads, *args, **kwargs):
        leaves, spec = jax.tree_util.tree_flatten((args, kwargs), is_leaf=lambda x: x is None)
        primal_at = [i for i, x in enumerate(leaves) if _is_float_array(x)]

        def of_primals(*primals):
            full = list(leaves)
            for i, p in zip(primal_at, primals):
                full[i] = p
            a, k = jax.tree_util.tree_unflatten(spec, full)
            return apply.flatten(fn(*a, **k))

        outs, pullback = jax.vjp(of_primals, *[leaves[i] for i in primal_at])
        return list(pullback([_cotangent(o, g) for o, g in zip(outs, grads)]))

    backward.__name__ = f"vjp_of_{getattr(fn, '__name__', 'jax_kernel')}"
    return backward


def _is_float_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.inexact)


def _cotangent(out, grad):
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, jax.dtypes.float0)
    if grad is None:
        return jnp.zeros_like(out)
    return jnp.asarray(grad).astype(out.dtype)
