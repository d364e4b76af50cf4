"""The PJRT client: which platform and devices torch-pjrt runs on, through JAX."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import jax

from .. import _env

# PyTorch needs exact int64 and float64; JAX is 32-bit unless told otherwise.
jax.config.update("jax_enable_x64", True)


# Steps that must run before JAX starts the PJRT client, registered by upper layers:
# distributed/ brings up JAX's multi-process runtime there when torchrun's variables say
# the job has several processes. A step returns None, or the JAX process indices whose
# devices are pjrt:0, pjrt:1, ... in this process (the processes on this host, in local
# rank order: pjrt:LOCAL_RANK is this process's own device, as cuda:LOCAL_RANK is).
before_start: list[Callable[[], list[int] | None]] = []
# How many devices devices() will list, where an upper layer knows it before the client
# starts (distributed/: a torchrun job's processes on this host, one device each), or None.
count_hints: list[Callable[[], int | None]] = []
_own = [0]  # the index of this process's own device (its first, single-process)
_foreign: set[int] = set()  # indices of other processes' devices


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    """The PJRT devices, in index order (pjrt:0, pjrt:1, ...)."""
    platform = _env.get("TORCH_PJRT_PLATFORM").strip().lower() or None
    host_processes = None
    for step in before_start:
        host_processes = step() or host_processes
    if _cpu_platform():
        from . import host_memory

        host_memory.tune()  # before the client starts its threads: they take malloc arenas
    try:
        found = jax.local_devices(backend=platform)
    except RuntimeError as e:
        raise RuntimeError(
            f"torch_pjrt: no PJRT devices for TORCH_PJRT_PLATFORM={platform!r}: {e}"
        ) from None
    if host_processes is None:
        return tuple(sorted(found, key=lambda d: d.id))
    # Several processes: each uses one device, its first; the others' are listed so that
    # device indices mean the same device in every process of the host.
    first = {}
    for d in sorted(jax.devices(platform), key=lambda d: d.id):
        first.setdefault(d.process_index, d)
    _own[0] = host_processes.index(jax.process_index())
    _foreign.update(i for i in range(len(host_processes)) if i != _own[0])
    return tuple(first[p] for p in host_processes)


def started() -> bool:
    """Whether the PJRT client is up (devices() ran)."""
    return devices.cache_info().currsize > 0


def known_count() -> int | None:
    """How many devices devices() lists, said without starting the PJRT client where only
    the settings decide it: on the cpu platform, one per process of a torchrun job on this
    host, else jax_num_cpu_devices or XLA's --xla_force_host_platform_device_count (or 1).
    None where only starting the client tells (an accelerator's plugin). The autograd
    engine and torch.accelerator ask the count: a CPU-only script must not start PJRT."""
    if started():
        return device_count()
    if not _cpu_platform():
        return None
    for hint in count_hints:
        n = hint()
        if n is not None:
            return n
    n = jax.config.jax_num_cpu_devices
    if n is not None and n >= 0:
        return n
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)",
                      os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else 1


def _cpu_platform() -> bool:
    """Whether devices() will be XLA:CPU's: TORCH_PJRT_PLATFORM=cpu, or no platform named
    and no accelerator plugin for JAX to prefer."""
    platform = _env.get("TORCH_PJRT_PLATFORM").strip().lower()
    return platform == "cpu" or (not platform and not _accelerator_plugins())


def own_index() -> int:
    """The index of the device this process computes on by default (pjrt:LOCAL_RANK in a
    multi-process job, else pjrt:0)."""
    devices()
    return _own[0]


@functools.cache
def _accelerator_plugins() -> bool:
    """Whether JAX could find a non-CPU PJRT plugin (so it may not pick the CPU)."""
    import importlib.metadata
    import pkgutil

    named = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if named:
        return named.split(",")[0].strip() != "cpu"
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
    if index in _foreign:
        raise RuntimeError(
            f"pjrt: pjrt:{index} is the device of another process of this job (local rank "
            f"{index}); this process computes on pjrt:{_own[0]} (torch.pjrt.set_device("
            f"LOCAL_RANK), or tensors on 'pjrt' without an index)")
    return devs[index]


def platform() -> str:
    return devices()[0].platform


def device_count() -> int:
    return len(devices())
