"""torch.compile support: the "pjrt" Dynamo backend (see backend.py) and Dynamo's device
interface for pjrt (device_interface.py)."""

from __future__ import annotations

from .._after_import import after_import

# torch.compile's cache entries (compile/warm.py): aot/<key>/<32 hex digits>.aot
AOT_FOLDER, AOT_SUFFIX, AOT_MAGIC = "aot", ".aot", b"TPJRTAO1"


def start() -> None:
    """Register the backend with Dynamo once PJRT has started and Dynamo is imported (now,
    if it is): importing Dynamo here would cost an eager process seconds. Shipped caches
    carry torch.compile's entries from now on, whether or not this process compiles (a
    `cache import` process never imports Dynamo)."""
    from ..runtime import cache_bundle

    cache_bundle.register_kind(AOT_FOLDER, AOT_SUFFIX, AOT_MAGIC,
                               r"pjrt[0-9a-z_]+/[0-9a-f]{32}\.aot")
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
