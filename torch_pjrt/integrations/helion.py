"""Helion kernels on pjrt: a kernel of Helion's Pallas backend as the pjrt kernel of a
PyTorch operator, through its JAX function (`Kernel.jax_fn`) and `register_jax`.

    import helion, helion.language as hl
    from torch_pjrt.integrations.helion import register_helion

    @helion.kernel(backend="pallas")
    def add(x, y): ...                       # Helion's language

    @torch.library.custom_op("mylib::add", mutates_args=())
    def add_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y
    add_op.register_fake(lambda x, y: torch.empty_like(x))
    register_helion(add_op, add)             # pjrt tensors: the Pallas kernel, on the device

The kernel is traced into the operator's XLA program like any `register_jax` function
(strict, fused and debug eager, `torch.compile(backend="pjrt")`): its inputs and result stay
on the device. Helion's Pallas code generation targets Mosaic (TPU): on every other platform
the kernel must run in Pallas's interpreter, which Helion decides when it compiles the kernel
(its `pallas_interpret` setting, not JAX's interpret switch that torch_pjrt.kernels.pallas
sets): `register_helion` turns that setting on where the platform is not a TPU.

Helion's reference mode (`helion.kernel(ref_mode=helion.RefMode.EAGER)` or
HELION_INTERPRET=1) needs nothing from here: it runs the kernel's body as PyTorch operations,
which run on pjrt tensors like any others (docs/custom-kernels.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import helion
import numpy as np

from ..kernels import register_jax
from ..runtime import client

__all__ = ["MOSAIC_PLATFORMS", "jax_function", "register_helion"]

# Platforms whose Pallas compiler runs the code Helion's Pallas backend generates (it calls
# Mosaic's TPU pipeline and reads the TPU's generation while it traces).
MOSAIC_PLATFORMS = frozenset({"tpu"})


def jax_function(kernel: helion.Kernel) -> Callable[..., Any]:
    """`kernel.jax_fn` (JAX arrays in, JAX arrays out), compiled for the platform torch-pjrt
    runs on: in Pallas's interpreter where the platform is not a TPU. Raises ValueError for a
    kernel of another Helion backend (Triton, CuTe...), which has no JAX function."""
    backend = kernel.settings.backend
    if backend != "pallas":
        raise ValueError(
            f"torch_pjrt.integrations.helion: Helion kernel {kernel.name!r} is compiled for "
            f"Helion's {backend!r} backend; only backend='pallas' kernels have a JAX function "
            "(helion.kernel(backend='pallas'), or HELION_BACKEND=pallas)")

    def traced(*args: Any) -> Any:
        _check_dtypes(kernel, args)
        _interpret_unless_mosaic(kernel)
        return kernel.jax_fn(*args)

    traced.__name__ = f"helion_{kernel.name}"
    # the compile cache hashes the file that defines the kernel's body (not this one), so
    # an edited Helion kernel never reuses a program compiled from its old code
    traced.__wrapped__ = kernel.fn
    return traced


def register_helion(op: Any, kernel: helion.Kernel, /) -> Any:
    """Register the Helion kernel `kernel` (Pallas backend) as the pjrt kernel of `op`, an
    operator defined with `torch.library.custom_op` or `torch.library.define`, whose
    arguments the kernel takes in schema order. Returns the OpOverload (as `register_jax`,
    whose rules it follows for the fake and for mutated arguments).

    Gradients come only from the op's `register_autograd` formula: JAX cannot differentiate
    Helion's Pallas kernels (`jax.vjp` of one fails in jax._src.hijax with "must override"),
    so no `jax.vjp` backward is installed."""
    return register_jax(op, jax_function(kernel), vjp_autograd=False)


def _interpret_unless_mosaic(kernel: helion.Kernel) -> None:
    """Turn on Helion's `pallas_interpret` for `kernel` off a TPU. Helion reads the setting
    when it generates a kernel's code, so kernels it generated before without it (they could
    not have run on this platform) are dropped."""
    if client.platform() in MOSAIC_PLATFORMS or kernel.settings.pallas_interpret:
        return
    kernel.settings.pallas_interpret = True
    kernel.reset()


def _check_dtypes(kernel: helion.Kernel, args: tuple[Any, ...]) -> None:
    """Refuse 64-bit arrays, as Helion's own launcher refuses 64-bit tensors (its `jax_fn`
    does not check): Helion traces its Pallas kernels with 32-bit JAX, and a float64 block
    sends Pallas's tiling into a loop that never ends (its packing is 32 // 64 = 0)."""
    for i, a in enumerate(args):
        dtype = getattr(a, "dtype", None)
        if dtype is not None and np.dtype(dtype) in _WIDE:
            raise TypeError(
                f"torch_pjrt.integrations.helion: Helion kernel {kernel.name!r}, argument {i}, is "
                f"{np.dtype(dtype)}: Helion's Pallas kernels take 32-bit and narrower dtypes "
                "(float32, bfloat16, float16, int32, int8, bool...); cast it first")


_WIDE = frozenset(np.dtype(t) for t in ("float64", "int64", "uint64", "complex128"))
