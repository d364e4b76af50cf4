"""register_jax: a JAX function (or Pallas kernel) as the pjrt kernel of a PyTorch operator."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._library import autograd as torch_autograd

from . import autograd_kernel, device, fake, library, vjp


def register_jax(op, fn: Callable | None = None, /, *, vjp_autograd: bool = True):
    """Register the JAX function `fn` as the `pjrt` kernel of `op`, an operator defined
    with `torch.library.custom_op` or `torch.library.define` (the CustomOpDef, an
    OpOverload, or "mylib::op"). Usable as a decorator: `@register_jax(mylib_op)`.

    `fn` takes the op's arguments in schema order: tensors as JAX arrays, every other
    argument as its Python value (a new value compiles a new program), keyword-only
    arguments as keywords. It returns the op's outputs; an op that mutates arguments
    (`mutates_args`) returns their new values first, in schema order, then its outputs.
    `fn` may call `pallas_call`: compiled natively on TPU and GPU, interpreted on
    XLA:CPU (torch_pjrt.kernels.pallas).

    The op keeps what its author registered: `register_fake` gives its output shapes
    (without one, `jax.eval_shape` of `fn` does), `register_autograd` its gradient.
    Without an autograd formula, a functional op is differentiated on pjrt through
    `jax.vjp` of `fn` (`vjp_autograd=False`: not at all), until the author registers one.
    Returns the OpOverload."""
    if fn is None:
        return lambda f: (register_jax(op, f, vjp_autograd=vjp_autograd), f)[1]
    overload = library.overload(op, "register_jax")
    if not callable(fn):
        raise TypeError(f"register_jax: fn must be a JAX function, got {fn!r}")
    device.install(overload, fn)
    fake.ensure(overload, fn)
    if vjp_autograd and vjp.applies(overload) and not _has_formula(overload):
        vjp.install(overload, fn, "AutogradPrivateUse1")
    elif (opdef := library.custom_op_def(overload)) is not None:
        # custom_op's own autograd kernel (its author's formula, or its error where there
        # is none), behind the C++ kernel that skips it when no gradient is recorded
        autograd_kernel.install(overload, torch_autograd.make_autograd_impl(overload, opdef))
    return overload


def _has_formula(op: library.OpOverload) -> bool:
    """Whether `op` has an autograd formula other than custom_op's (whose formula is read
    at each call, so the vjp stands in until the author registers one)."""
    if library.custom_op_def(op) is not None:
        return False
    name = library.qualname(op)
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
               for key in ("Autograd", "AutogradPrivateUse1", "CompositeImplicitAutograd"))
