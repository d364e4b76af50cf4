"""jax_op: define an operator from a JAX function alone, for pjrt and CPU tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import device, fake, host, library, vjp


def jax_op(qualname: str, schema: str, *, differentiable: bool = True) -> Callable:
    """Define the operator `qualname` ("mylib::op") with `schema` (its signature without
    the name, e.g. "(Tensor x, float beta) -> Tensor") and `fn` as its only
    implementation: on pjrt tensors through the executor, on CPU tensors through JAX on
    the host, output shapes from jax.eval_shape, gradients (on every device) from
    jax.vjp unless `differentiable=False`.

        @torch_pjrt.kernels.jax_op("mylib::swish", "(Tensor x, float beta) -> Tensor")
        def swish(x, beta):
            return x * jax.nn.sigmoid(beta * x)

    Operators written for PyTorch users first (a custom_op with a PyTorch body, a fake and
    an autograd formula) take a JAX kernel with register_jax instead."""
    ns, name = qualname.split("::")

    def define(fn: Callable) -> library.OpOverload:
        library.library(ns, "FRAGMENT").define(name + schema)
        op = getattr(getattr(torch.ops, ns), name).default
        torch.library.register_fake(qualname, fake.from_jax(op, fn),
                                    lib=library.library(ns, "FRAGMENT"))
        host.register(op, fn)
        device.install(op, fn)
        if differentiable and vjp.applies(op):
            vjp.install(op, fn, "Autograd")
        return op

    return define
