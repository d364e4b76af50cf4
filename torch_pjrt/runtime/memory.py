"""Device memory accounting: bytes held by live pjrt storages, per device."""

from __future__ import annotations

import os

import torch

from .. import _env


class DeviceMemory:
    """Counters of one device; reserve/release run on every allocation, so they stay small."""

    __slots__ = ("index", "allocated", "peak", "allocs", "frees", "ooms", "limit", "soft_limit")

    def __init__(self, index: int):
        self.index = index
        self.allocated = 0
        self.peak = 0
        self.allocs = 0
        self.frees = 0
        self.ooms = 0
        self.limit = _limit(index)
        self.soft_limit = int(self.limit * PRESSURE)  # past it, on_pressure is called

    def set_limit(self, nbytes: int) -> None:
        self.limit = nbytes
        self.soft_limit = int(nbytes * PRESSURE)


def _limit(device: int) -> int:
    """Bytes torch-pjrt may hold on `device` (TORCH_PJRT_MEMORY_LIMIT or the device's own)."""
    explicit = _env.get("TORCH_PJRT_MEMORY_LIMIT").strip()
    if explicit:
        return int(float(explicit))
    from . import client

    stats = client.device(device).memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_devices: dict[int, DeviceMemory] = {}


def device(index: int) -> DeviceMemory:
    m = _devices.get(index)
    if m is None:
        m = _devices[index] = DeviceMemory(index)
    return m


# Called when an allocation passes PRESSURE of the limit, so that a pending fused
# graph runs and frees the buffers only its dead temporaries hold (set by eager.graph).
on_pressure = None
PRESSURE = 0.9


def reserve(index: int, nbytes: int) -> None:
    """Account for a new storage, raising torch.OutOfMemoryError past the limit."""
    m = _devices.get(index) or device(index)
    total = m.allocated + nbytes
    if total > m.soft_limit:
        _near_limit(m, total, nbytes)
        total = m.allocated + nbytes  # another thread may have freed storages meanwhile
    m.allocated = total
    m.allocs += 1
    if total > m.peak:
        m.peak = total


def _near_limit(m: DeviceMemory, total: int, nbytes: int) -> None:
    if on_pressure is not None:
        on_pressure()
    if total > m.limit:
        m.ooms += 1
        raise torch.OutOfMemoryError(
            f"pjrt: out of memory on pjrt:{m.index}: tried to allocate {_fmt(nbytes)} with "
            f"{_fmt(m.allocated)} already allocated (limit {_fmt(m.limit)}; "
            "set TORCH_PJRT_MEMORY_LIMIT to change it)"
        )


def release(index: int, nbytes: int) -> None:
    m = _devices[index]
    m.allocated -= nbytes
    m.frees += 1


def allocated(index: int) -> int:
    return device(index).allocated


def peak(index: int) -> int:
    return device(index).peak


def reset_peak(index: int) -> None:
    m = device(index)
    m.peak = m.allocated


def stats(index: int) -> dict[str, int]:
    """The subset of torch.cuda.memory_stats() keys that make sense for PJRT buffers.

    XLA frees a buffer when its last reference dies and keeps no cache, so the active and
    reserved bytes are the allocated ones and an allocation is never retried."""
    m = device(index)
    return {
        "allocated_bytes.all.current": m.allocated,
        "allocated_bytes.all.peak": m.peak,
        "active_bytes.all.current": m.allocated,
        "active_bytes.all.peak": m.peak,
        "reserved_bytes.all.current": m.allocated,
        "reserved_bytes.all.peak": m.peak,
        "allocation.all.allocated": m.allocs,
        "allocation.all.freed": m.frees,
        "allocation.all.current": m.allocs - m.frees,
        "num_alloc_retries": 0,
        "num_ooms": m.ooms,
        "bytes_limit": m.limit,
    }


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)
