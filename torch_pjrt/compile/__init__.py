"""torch.compile support: the "pjrt" Dynamo backend (see backend.py) and Dynamo's device
interface for pjrt (device_interface.py)."""

from __future__ import annotations

from .._after_import import after_import


def start() -> None:
    """Register the backend once PJRT has started (backend.py is not imported at
    `import torch`)."""
    from . import backend

    backend.register()


def register_device_interface() -> None:
    """Register pjrt's DeviceInterface with Dynamo as soon as Dynamo's registry exists (its
    module imported: importing Dynamo here would cost `import torch` seconds)."""
    after_import("torch._dynamo.device_interface", _register_device_interface)


def _register_device_interface() -> None:
    from . import device_interface  # noqa: F401 - importing it registers the interface
