"""Device memory accounting: bytes held by live pjrt storages, per device."""

from __future__ import annotations

import os
from collections import defaultdict

import torch

from .. import _env

_allocated: dict[int, int] = defaultdict(int)
_peak: dict[int, int] = defaultdict(int)
_num_allocs: dict[int, int] = defaultdict(int)
_num_frees: dict[int, int] = defaultdict(int)
_num_ooms: dict[int, int] = defaultdict(int)
_limits: dict[int, int] = {}


def limit(device: int) -> int:
    """Bytes torch-pjrt may hold on `device` (TORCH_PJRT_MEMORY_LIMIT or the device's own)."""
    if device not in _limits:
        explicit = _env.get("TORCH_PJRT_MEMORY_LIMIT").strip()
        if explicit:
            _limits[device] = int(float(explicit))
        else:
            _limits[device] = _device_limit(device)
    return _limits[device]


def _device_limit(device: int) -> int:
    from . import client

    stats = client.device(device).memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def reserve(device: int, nbytes: int) -> None:
    """Account for a new storage, raising torch.OutOfMemoryError past the limit."""
    total = _allocated[device] + nbytes
    if total > limit(device):
        _num_ooms[device] += 1
        raise torch.OutOfMemoryError(
            f"pjrt: out of memory on pjrt:{device}: tried to allocate {_fmt(nbytes)} with "
            f"{_fmt(_allocated[device])} already allocated (limit {_fmt(limit(device))}; "
            "set TORCH_PJRT_MEMORY_LIMIT to change it)"
        )
    _allocated[device] = total
    _num_allocs[device] += 1
    if total > _peak[device]:
        _peak[device] = total


def release(device: int, nbytes: int) -> None:
    _allocated[device] -= nbytes
    _num_frees[device] += 1


def allocated(device: int) -> int:
    return _allocated[device]


def peak(device: int) -> int:
    return _peak[device]


def reset_peak(device: int) -> None:
    _peak[device] = _allocated[device]


def stats(device: int) -> dict[str, int]:
    """The subset of torch.cuda.memory_stats() keys that make sense for PJRT buffers."""
    return {
        "allocated_bytes.all.current": _allocated[device],
        "allocated_bytes.all.peak": _peak[device],
        "allocation.all.allocated": _num_allocs[device],
        "allocation.all.freed": _num_frees[device],
        "allocation.all.current": _num_allocs[device] - _num_frees[device],
        "num_ooms": _num_ooms[device],
        "bytes_limit": limit(device),
    }


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)
