"""torch-pjrt: a PyTorch device backend (`pjrt`) for every OpenXLA PJRT plugin."""

from .runtime import DEVICE_TYPE, ensure_initialized, register

register()

from .counters import metrics  # noqa: E402

__all__ = ["DEVICE_TYPE", "ensure_initialized", "metrics", "register"]
__version__ = "0.1.0"
