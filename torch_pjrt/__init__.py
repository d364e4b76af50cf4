"""torch-pjrt: a PyTorch device backend (`pjrt`) for every OpenXLA PJRT plugin."""

from .runtime import DEVICE_TYPE, ensure_initialized, register

register()

from .distributed import register as _register_distributed  # noqa: E402

_register_distributed()

from . import kernels  # noqa: E402
from .counters import metrics  # noqa: E402
from .eager.modes import get as get_eager_mode  # noqa: E402
from .eager.modes import set_eager_mode  # noqa: E402

__all__ = ["DEVICE_TYPE", "ensure_initialized", "get_eager_mode", "kernels", "metrics",
           "register", "set_eager_mode"]
__version__ = "0.1.0"
