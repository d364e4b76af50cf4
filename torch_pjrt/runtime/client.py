"""The PJRT client: which platform and devices torch-pjrt runs on, through JAX."""

from __future__ import annotations

import functools

import jax

from .. import _env
from .platform import before_start, cpu_platform

# (64-bit JAX: runtime.register() turns it on when JAX is imported)

_own = [0]  # the index of this process's own device (its first, single-process)
_foreign: set[int] = set()  # indices of other processes' devices


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    """The PJRT devices, in index order (pjrt:0, pjrt:1, ...)."""
    platform = _env.get("TORCH_PJRT_PLATFORM").strip().lower() or None
    host_processes = None
    for step in before_start:
        host_processes = step() or host_processes
    if cpu_platform():
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


def own_index() -> int:
    """The index of the device this process computes on by default (pjrt:LOCAL_RANK in a
    multi-process job, else pjrt:0)."""
    devices()
    return _own[0]


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
