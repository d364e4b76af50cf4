"""The runtime: registers the `pjrt` device with PyTorch and starts PJRT on first use.

`register()` is cheap and runs at `import torch` (autoload): it names the
device, installs the native hooks and a trigger kernel. The PJRT client, JAX
and the kernels are set up by `ensure_initialized()`, on the first op or
device query, so that `import torch` alone does not start an accelerator.
"""

from __future__ import annotations

import atexit
import threading

import torch

DEVICE_TYPE = "pjrt"

_lock = threading.RLock()
_registered = False
_initialized = False
_native = None
_libs: list[torch.library.Library] = []


def shim():
    return _native


def register() -> None:
    """Name PrivateUse1 `pjrt`, install the device module and the native hooks."""
    global _registered, _native
    with _lock:
        if _registered:
            return
        from . import device_module
        from .native import load

        torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
        torch._register_device_module(DEVICE_TYPE, device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
        _native = load()
        _native.install(_device_count, _free, _synchronize)
        trigger = torch.library.Library("_", "IMPL", "PrivateUse1")
        trigger.fallback(_first_use)
        _libs.append(trigger)
        _registered = True


def _device_count() -> int:
    ensure_initialized()
    from . import client

    return client.device_count()


def _free(ptr: int) -> None:
    """Until PJRT starts no storage holds a buffer; then the table's own free is used."""


def _synchronize(device: int) -> None:
    from . import sync

    sync.synchronize(device)


def _first_use(op, *args, **kwargs):
    ensure_initialized()
    return op(*args, **kwargs)


def ensure_initialized() -> None:
    """Start PJRT (through JAX) and register every kernel; idempotent."""
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        register()
        from .. import optim_step
        from ..eager import dispatch, executor, graph, modes
        from ..storage import table
        from . import client, sync

        client.devices()
        atexit.register(sync.drain)
        table.install(_native, graph.flush)
        graph.configure()
        optim_step.install()
        modes.init_from_env()
        _native.set_free_callback(table.free)
        executor.install(_native, DEVICE_TYPE)
        _libs[0]._destroy()  # the trigger fallback gives way to the real one
        lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
        fallback_lib = torch.library.Library("_", "IMPL", "PrivateUse1")
        dispatch.install(lib, fallback_lib)
        _libs[:] = [lib, fallback_lib]
        from .. import kernels
        from ..compile import backend

        backend.register()
        kernels.install_pending()
        _initialized = True
