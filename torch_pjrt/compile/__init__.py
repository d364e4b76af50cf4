"""torch.compile support: the "pjrt" Dynamo backend (see backend.py) and Dynamo's device
interface for pjrt (device_interface.py)."""

from __future__ import annotations

from .._after_import import after_import


def start() -> None:
    """Register the backend with Dynamo once PJRT has started and Dynamo is imported (now,
    if it is): importing Dynamo here would cost an eager process seconds."""
    after_import("torch._dynamo", _register_backend)


def _register_backend() -> None:
    from . import dynamo_hooks

    dynamo_hooks.register()


def register_device_interface() -> None:
    """Register pjrt's DeviceInterface with Dynamo as soon as Dynamo's registry exists (its
    module imported: importing Dynamo here would cost `import torch` seconds)."""
    after_import("torch._dynamo.device_interface", _register_device_interface)


def _register_device_interface() -> None:
    from . import device_interface  # noqa: F401 - importing it registers the interface
