"""The runtime: registers the `pjrt` device with PyTorch and starts PJRT on first use.

`register()` is cheap and runs at `import torch` (autoload): it names the
device, installs the native hooks and a trigger kernel. The PJRT client, JAX
and the kernels are set up by `ensure_initialized()`, on the first op or
device query, so that `import torch` alone does not start an accelerator: it
starts the client, then runs the steps the upper layers added with
`on_initialize()` (torch_pjrt/__init__.py adds them, bottom layer first).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import warnings
from collections.abc import Callable

import torch

from .._after_import import after_import

DEVICE_TYPE = "pjrt"

_lock = threading.RLock()
_registered = False
_initialized = False
_native = None
_libs: list[torch.library.Library] = []
_steps: list[Callable[[], None]] = []  # on_initialize()


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
        from . import memory

        _native.install(_device_count, _known_count, _free, _synchronize, memory)
        from . import device_trace, dumps

        device_trace.install(_native)  # torch.profiler's pjrt activity
        dumps.configure()
        # PyTorch needs exact int64 and float64; JAX is 32-bit unless told otherwise. Set
        # when anything imports JAX (the client does at the first pjrt use), not by
        # importing it here: JAX's import is not paid by scripts that never use pjrt.
        after_import("jax", _jax_64_bit)
        trigger = torch.library.Library("_", "IMPL", "PrivateUse1")
        trigger.fallback(_first_use)
        _libs.append(trigger)
        _registered = True


def _jax_64_bit() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)


def _device_count() -> int:
    ensure_initialized()
    from . import client

    return client.device_count()


def available() -> bool:
    """Whether a pjrt device exists, said without starting PJRT where the settings decide
    it (platform.known_count); otherwise PJRT starts to count."""
    from . import platform

    n = platform.known_count()
    if n is not None:
        return n > 0
    try:
        return _device_count() > 0
    except RuntimeError:
        return False


def _known_count() -> int | None:
    from . import platform

    return platform.known_count()


def _free(ptr: int) -> None:
    """Until PJRT starts no storage holds a buffer; then the table's own free is used."""


def _synchronize(device: int) -> None:
    from . import sync

    sync.synchronize(device)


def _first_use(op, *args, **kwargs):
    ensure_initialized()
    return op(*args, **kwargs)


def _check_count_given(given: int, count: int) -> None:
    """The autograd engine made one worker per device when it asked the count before PJRT
    started: a backward pass on a device past that count would fail inside PyTorch."""
    if 0 <= given < count:
        warnings.warn(
            f"torch_pjrt: PJRT started with {count} devices, but {given} was the count "
            "given before it started (from the settings: XLA_FLAGS, jax_num_cpu_devices, "
            "torchrun's variables, which changed since); a backward pass on pjrt:"
            f"{given} or above may fail: settle them before the first backward pass",
            RuntimeWarning, stacklevel=2)


def on_initialize(step: Callable[[], None]) -> None:
    """Add a step to what ensure_initialized() runs once PJRT has started, after the
    steps added before it (run at once where PJRT has started already). The layers above
    the runtime (eager, compile, kernels...) start this way: the runtime imports none of
    them."""
    with _lock:
        _steps.append(step)
        if _initialized:
            step()


def kernel_libraries() -> tuple[torch.library.Library, torch.library.Library]:
    """The libraries for the device's real kernels (aten ops, and the fallback of every
    other op), which the trigger fallback gives way to; kept alive here."""
    _libs[0]._destroy()
    lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    fallback_lib = torch.library.Library("_", "IMPL", "PrivateUse1")
    _libs[:] = [lib, fallback_lib]
    return lib, fallback_lib


@contextlib.contextmanager
def _collections_paused():
    """Python's cyclic garbage collection paused while PJRT starts. Importing JAX and
    building the op tables make some 100,000 objects, all as long-lived as the process,
    and the full collections their number sets off walk the whole heap (torch's, the
    user's libraries') and free nothing: two of them took a fifth of a warm process's
    first op (docs/compile-cost.md). Restored after, as it was (collection a caller
    turned off stays off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def ensure_initialized() -> None:
    """Start PJRT (through JAX), then run the steps the upper layers added; idempotent."""
    global _initialized
    if _initialized:
        return
    with _lock, _collections_paused():
        if _initialized:
            return
        register()
        from . import client, sync

        client.devices()
        atexit.register(sync.drain)
        for step in _steps:
            step()
        _initialized = True
        _check_count_given(_native.mark_started(client.device_count()), client.device_count())
        from . import device_module

        device_module.apply_queued_seeds()
