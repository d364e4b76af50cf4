"""torch-pjrt: a PyTorch device backend (`pjrt`) for every OpenXLA PJRT plugin."""

from .runtime import DEVICE_TYPE, ensure_initialized, on_initialize, register

register()

from .distributed import register as _register_distributed  # noqa: E402

_register_distributed()

from . import compile, eager, kernels, optim_step, profiler  # noqa: E402
from .eager.modes import get as get_eager_mode  # noqa: E402
from .eager.modes import set_eager_mode  # noqa: E402
from .eager.tiers import wait_for_compiles  # noqa: E402
from .report import metrics  # noqa: E402

compile.register_device_interface()

from .integrations import huggingface as _huggingface  # noqa: E402

_huggingface.install(DEVICE_TYPE)

# What ensure_initialized() runs once PJRT has started, bottom layer first (the runtime
# imports no layer above it; each one adds its own start here).
for _step in (eager.start, optim_step.install, compile.start):
    on_initialize(_step)

__all__ = ["DEVICE_TYPE", "ensure_initialized", "get_eager_mode", "kernels", "metrics",
           "profiler", "register", "set_eager_mode", "wait_for_compiles"]
__version__ = "0.1.0"
