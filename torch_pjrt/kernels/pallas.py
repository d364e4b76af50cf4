"""Where Pallas kernels compile: natively on TPU and GPU, in Pallas's interpreter on XLA:CPU.

A JAX function registered as a pjrt kernel may call `pallas_call`. Mosaic (TPU) and
Triton or Mosaic GPU (NVIDIA, AMD) compile it into the program; XLA:CPU has no Pallas
compiler, so on the cpu platform every `pallas_call` traced inside a registered function
runs in Pallas's interpreter (a `jax.jit` of a loop over the grid, so the same kernel is
tested on a laptop, slowly). The choice is made when the function is traced, per program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from jax._src import config as _jax_config

from ..runtime import client

# Platforms whose PJRT plugin compiles Pallas kernels: Mosaic on TPU, Triton (or Mosaic
# GPU) on NVIDIA and AMD GPUs. JAX names the GPU platforms cuda and rocm (gpu in older
# releases).
NATIVE_PLATFORMS = frozenset({"tpu", "cuda", "rocm", "gpu"})

# JAX's switch that turns every pallas_call traced while it is set into interpreter mode
# (what jax.experimental.pallas.tpu.force_tpu_interpret_mode sets, with True for the
# generic interpreter instead of the TPU simulator).
_INTERPRET = _jax_config.pallas_tpu_interpret_mode_context_manager


def native() -> bool:
    """Whether the platform torch-pjrt runs on compiles Pallas kernels natively (TPU, GPU);
    False on XLA:CPU, where they run in Pallas's interpreter."""
    return client.platform() in NATIVE_PLATFORMS


def interpreting(fn: Callable) -> Callable:
    """`fn`, tracing its `pallas_call`s in interpreter mode where the platform has no
    Pallas compiler (and as written elsewhere)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        if native():
            return fn(*args, **kwargs)
        previous = _INTERPRET.swap_local(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _INTERPRET.set_local(previous)

    return traced
