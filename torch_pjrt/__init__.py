"""torch-pjrt: a PyTorch device backend (`pjrt`) for every OpenXLA PJRT plugin.

Importing it (PyTorch's autoload does, at `import torch`) registers the device and imports
no JAX: a script that never touches `pjrt` pays milliseconds for it. JAX, the client, the
eager executor and the kernels start at the first pjrt op or device query
(`runtime.ensure_initialized`), or when one of the modules below is used.
"""

from __future__ import annotations

import importlib

from . import compile, eager, optim_step, profiler
from .eager.modes import get as get_eager_mode
from .eager.modes import set_eager_mode
from .report import metrics
from .runtime import DEVICE_TYPE, ensure_initialized, on_initialize, register

register()

from .distributed import register as _register_distributed  # noqa: E402

_register_distributed()
compile.register_device_interface()

from .integrations import huggingface as _huggingface  # noqa: E402

_huggingface.install(DEVICE_TYPE)


def _start_kernels() -> None:
    """Register the shipped kernels' operators (nn.LSTM's scan; the Pallas examples where
    the platform compiles them natively: kernels/__init__.py)."""
    importlib.import_module(".kernels", __name__).start()


# What ensure_initialized() runs once PJRT has started, bottom layer first (the runtime
# imports no layer above it; each one adds its own start here). The kernels' operators
# register before eager.start, which builds the dispatch tables from the lowerings.
for _step in (_start_kernels, eager.start, optim_step.install, compile.start):
    on_initialize(_step)


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait for the fused programs compiling in the background and take them into use
    (eager/tiers.py); False if `timeout` seconds passed first."""
    from .eager import tiers

    return tiers.wait_for_compiles(timeout)


def __getattr__(name: str):
    """`torch_pjrt.kernels` without importing JAX at `import torch`."""
    if name == "kernels":
        return importlib.import_module(".kernels", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEVICE_TYPE", "ensure_initialized", "get_eager_mode", "kernels", "metrics",
           "profiler", "register", "set_eager_mode", "wait_for_compiles"]
__version__ = "0.1.0"
