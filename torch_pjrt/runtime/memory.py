"""Device memory accounting: bytes held by live pjrt storages, per device.

It is the one account behind torch.pjrt's memory functions and torch.accelerator's (the
native allocator, a c10::DeviceAllocator, reads stats() and calls the resets here).
"""

from __future__ import annotations

import gc
import os
from collections import OrderedDict

import torch

from .. import _env


class DeviceMemory:
    """Counters of one device; reserve/release run on every allocation, so they stay small
    (the native op kernel updates the same slots: runtime/native/op_kernel.cpp)."""

    __slots__ = ("index", "allocated", "peak", "allocs", "frees", "ooms", "limit", "soft_limit",
                 "total", "live_peak", "base")

    def __init__(self, index: int):
        self.index = index
        self.allocated = 0  # bytes of the live storages
        self.peak = 0  # the most `allocated` has been since the last reset_peak
        self.allocs = 0  # storages allocated, ever
        self.frees = 0  # storages freed, ever
        self.ooms = 0
        self.total = 0  # bytes allocated, ever
        self.live_peak = 0  # the most live storages there have been since the last reset_peak
        # (total, allocated, allocs, frees, ooms) at the last reset_accumulated
        self.base = (0, 0, 0, 0, 0)
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
    m.total += nbytes
    if total > m.peak:
        m.peak = total
    if m.allocs - m.frees > m.live_peak:
        m.live_peak = m.allocs - m.frees


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
    m.live_peak = m.allocs - m.frees


def reset_accumulated(index: int) -> None:
    """Start the counts of allocations, frees and OOMs over (their totals since now)."""
    m = device(index)
    m.base = (m.total, m.allocated, m.allocs, m.frees, m.ooms)


def empty_cache() -> None:
    """Free the buffers of tensors no one can reach any more (those in reference cycles):
    XLA frees a buffer when its last tensor dies and torch-pjrt keeps no cache."""
    gc.collect()


def memory_info(index: int) -> tuple[int, int]:
    """(free, total): the bytes torch-pjrt may still allocate on the device before
    torch.OutOfMemoryError, and its limit (TORCH_PJRT_MEMORY_LIMIT or the device's own)."""
    m = device(index)
    return max(m.limit - m.allocated, 0), m.limit


_POOLS = ("all", "small_pool", "large_pool")


def stats(index: int) -> dict:
    """The statistics of torch.cuda.memory_stats(), nested as PyTorch's DeviceAllocator
    reports them ({name: {pool: {current, peak, allocated, freed}}} and counters).

    XLA frees a buffer when its last reference dies and keeps no cache, so the active,
    reserved and requested bytes are the allocated ones, each buffer is its own segment,
    nothing is split and an allocation is never retried. There are no pools: "all" holds
    every figure and "small_pool"/"large_pool" are zero. `allocated` and `freed` count from
    the last reset_accumulated, `peak` from the last reset_peak."""
    m = device(index)
    total, allocated, allocs, frees, ooms = m.base
    new_bytes = m.total - total
    nbytes = {"current": m.allocated, "peak": m.peak, "allocated": new_bytes,
              "freed": new_bytes - (m.allocated - allocated)}
    count = {"current": m.allocs - m.frees, "peak": m.live_peak,
             "allocated": m.allocs - allocs, "freed": m.frees - frees}
    zero = dict.fromkeys(nbytes, 0)

    def pools(all_pools: dict) -> dict:
        return {pool: all_pools if pool == "all" else zero for pool in _POOLS}

    return {
        "allocation": pools(count), "segment": pools(count), "active": pools(count),
        "inactive_split": pools(zero),
        "allocated_bytes": pools(nbytes), "reserved_bytes": pools(nbytes),
        "active_bytes": pools(nbytes), "requested_bytes": pools(nbytes),
        "inactive_split_bytes": pools(zero),
        "oversize_allocations": zero, "oversize_segments": zero,
        "num_alloc_retries": 0, "num_ooms": m.ooms - ooms, "num_sync_all_streams": 0,
        "num_device_alloc": m.allocs - allocs, "num_device_free": m.frees - frees,
        "max_split_size": -1,  # no limit, as CUDA reports it by default
    }


def flat_stats(index: int) -> OrderedDict[str, int]:
    """stats() flattened as torch.accelerator.memory_stats() flattens it: dotted keys
    ("allocated_bytes.all.peak"), in sorted order."""
    flat: list[tuple[str, int]] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, value))

    walk("", stats(index))
    return OrderedDict(sorted(flat))


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)
