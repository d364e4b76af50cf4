"""The PJRT client: which platform and devices torch-pjrt runs on, through JAX."""

from __future__ import annotations

import functools
import os

import jax

from .. import _env

# PyTorch needs exact int64 and float64; JAX is 32-bit unless told otherwise.
jax.config.update("jax_enable_x64", True)


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    """The local PJRT devices, in index order (pjrt:0, pjrt:1, ...)."""
    platform = _env.get("TORCH_PJRT_PLATFORM").strip().lower() or None
    if platform == "cpu" or (platform is None and not _accelerator_plugins()):
        from . import host_memory

        host_memory.tune()  # before the client starts its threads: they take malloc arenas
    try:
        found = jax.local_devices(backend=platform)
    except RuntimeError as e:
        raise RuntimeError(
            f"torch_pjrt: no PJRT devices for TORCH_PJRT_PLATFORM={platform!r}: {e}"
        ) from None
    return tuple(sorted(found, key=lambda d: d.id))


def _accelerator_plugins() -> bool:
    """Whether JAX could find a non-CPU PJRT plugin (so it may not pick the CPU)."""
    import importlib.metadata
    import pkgutil

    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return False
    try:
        import jax_plugins  # namespace package of PJRT plugins
        if any(True for _ in pkgutil.iter_modules(jax_plugins.__path__)):
            return True
    except ImportError:
        pass
    return bool(importlib.metadata.entry_points(group="jax_plugins"))


def device(index: int) -> jax.Device:
    devs = devices()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"pjrt: invalid device index {index} (there are {len(devs)} pjrt devices)"
        )
    return devs[index]


def platform() -> str:
    return devices()[0].platform


def device_count() -> int:
    return len(devices())
