"""Device storages: one flat XLA buffer per PyTorch storage, keyed by its data pointer.

The native allocator hands PyTorch a unique handle as the storage's data pointer
and calls `free` when the storage dies; this table maps the handle to the
buffer. Views are PyTorch metadata over the same storage, so they share it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import client, device_module, memory
from . import dtypes, views


class StorageRecord:
    """The device buffer behind one PyTorch storage.

    `value` is a flat jax.Array of `dtype` with `numel` elements, or None while
    the storage is uninitialized (torch.empty): it reads as zeros.
    """

    __slots__ = ("value", "dtype", "numel", "nbytes", "device")

    def __init__(self, dtype: np.dtype, nbytes: int, device: int, value=None):
        if nbytes % dtype.itemsize:
            dtype = np.dtype(np.uint8)
        self.dtype = dtype
        self.nbytes = nbytes
        self.numel = nbytes // dtype.itemsize
        self.device = device
        self.value = value

    def get(self):
        """The buffer: computed (flushing a pending fused graph) or zeros if uninitialized."""
        if getattr(self.value, "pending", False):
            flush_pending("data read")
            if getattr(self.value, "pending", False):  # graph.Lost: its graph failed
                self.value.fail()
        if self.value is None:
            self.value = _zeros(self.numel, self.dtype, self.device)
        return self.value

    def set(self, value) -> None:
        self.value = value
        self.dtype = np.dtype(value.dtype)
        self.numel = value.shape[0]


_records: dict[int, StorageRecord] = {}
_native = None  # the shim, set by install()
flush_pending = None  # runs the pending fused graph, set by install()


def install(native, flush) -> None:
    global _native, flush_pending
    _native = native
    flush_pending = flush
    native.set_resize_callback(resize)
    native.set_copy_callback(copy)
    # what torch.pjrt / torch.accelerator.get_device_capability() report
    device_module.set_supported_dtypes(dtypes.supported(client.platform()))


def free(ptr: int) -> None:
    """Called by the native allocator when a storage dies."""
    rec = _records.pop(ptr, None)
    if rec is not None:
        m = memory._devices[rec.device]
        m.allocated -= rec.nbytes
        m.frees += 1


def resize(old_ptr: int, new_ptr: int, nbytes: int) -> None:
    """Called by the native hooks for untyped_storage().resize_(nbytes): the record moves
    to the storage's new handle (the same one when it shrinks) and keeps the first
    min(old, new) bytes of its buffer; bytes past the old end read as zeros."""
    rec = _records.get(old_ptr)
    if rec is None:
        return
    old = rec.get() if rec.value is not None and nbytes else None  # (a pending one runs)
    del _records[old_ptr]
    memory.release(rec.device, rec.nbytes)
    memory.reserve(rec.device, nbytes)
    if old is not None:
        if nbytes % rec.dtype.itemsize:  # keep it in bytes
            old = jax.lax.bitcast_convert_type(old, jnp.uint8).reshape(-1) \
                if rec.dtype != np.uint8 else old
            rec.dtype = np.dtype(np.uint8)
        rec.value = _resized(old, nbytes // rec.dtype.itemsize)
    else:
        rec.value = None  # nothing written yet, or nothing left: reads as zeros
    if nbytes % rec.dtype.itemsize:
        rec.dtype = np.dtype(np.uint8)
    rec.nbytes = nbytes
    rec.numel = nbytes // rec.dtype.itemsize
    _records[new_ptr] = rec


def copy(dest_ptr: int, src_ptr: int, nbytes: int) -> None:
    """Called by the native allocator when a copy-on-write storage (torch._lazy_clone) is
    first written while shared: the fresh handle `dest_ptr` gets a copy of the buffer of
    `src_ptr` on dest's device (a pending one runs first). A copy, not the same array: an
    in-place op donates its input buffer, which would delete the other side's. A source
    with no record was never written: the copy reads as zeros too."""
    src = _records.get(src_ptr)
    device = _native.device_from_ptr(dest_ptr)
    memory.reserve(device, nbytes)
    rec = _records[dest_ptr] = StorageRecord(
        src.dtype if src is not None else np.dtype(np.uint8), nbytes, device)
    if src is None or src.value is None:
        return
    value = jax.device_put(src.get(), client.device(device), may_alias=False)
    rec.set(value)


def _resized(flat, numel: int):
    keep = min(flat.shape[0], numel)
    head = flat[:keep]
    if keep == numel:
        return head
    return jnp.concatenate([head, jnp.zeros((numel - keep,), flat.dtype)])


_HANDLE_ALIGN = 256  # the native allocator's handles are multiples of it (shim.cpp's kAlign)


def _inside(ptr: int) -> int | None:
    """The handle of the storage whose bytes `ptr` points into, past its start (a byte
    slice of it, UntypedStorage[start:stop]), or None."""
    for handle, rec in _records.items():
        if handle < ptr < handle + max(rec.nbytes, 1):
            return handle
    return None


class SliceRecord(StorageRecord):
    """A byte slice of another storage (UntypedStorage[start:stop] makes a storage whose
    data pointer is the other's plus `start`). It has no buffer of its own: it reads the
    bytes of its parent's, so it sees every write to the parent. Writing through it is
    refused (call_key): the write would have to land in the parent's buffer."""

    __slots__ = ("parent", "start")

    def __init__(self, parent: StorageRecord, start: int, nbytes: int):
        self.parent = parent
        self.start = start
        self.dtype = np.dtype(np.uint8)
        self.nbytes = self.numel = nbytes
        self.device = parent.device

    @property
    def value(self):
        parent = self.parent
        if parent.value is None:
            return None  # the parent was never written: reads as zeros
        flat = views._to_bytes(parent.get())
        return flat[self.start:self.start + self.nbytes]

    @value.setter
    def value(self, value) -> None:
        raise RuntimeError(SLICE_WRITE)

    def set(self, value) -> None:
        raise RuntimeError(SLICE_WRITE)


SLICE_WRITE = (
    "pjrt: writing through a storage slice (a storage starting inside another, as "
    "UntypedStorage[start:stop] makes) is not supported: pjrt's buffers belong to whole "
    "storages, and slices read them. Write through a tensor over the whole storage instead "
    "(torch.tensor([], dtype=torch.uint8, device=s.device).set_(s)[start:stop])")


def record(storage: torch.UntypedStorage) -> StorageRecord:
    """The record of a pjrt storage (created for storages made outside torch_pjrt)."""
    ptr = storage.data_ptr()
    rec = _records.get(ptr)
    if rec is None:
        # PyTorch slices a storage (UntypedStorage[start:stop], TypedStorage slices) into a
        # new storage whose data pointer is the old one plus `start`: not a handle of its
        # own. Its bytes are the old storage's, read through a SliceRecord.
        parent = _inside(ptr)
        if parent is not None:
            return SliceRecord(_records[parent], ptr - parent, storage.nbytes())
        if ptr % _HANDLE_ALIGN:
            raise RuntimeError(
                f"pjrt: a storage of {storage.nbytes()} bytes whose data pointer lies inside "
                "no live pjrt storage: its bytes are unknown")
        nbytes = storage.nbytes()
        device = storage.device.index or 0
        memory.reserve(device, nbytes)
        rec = _records[ptr] = StorageRecord(np.dtype(np.uint8), nbytes, device)
    return rec


def record_of(t: torch.Tensor) -> StorageRecord:
    """The record `t` writes: a copy-on-write storage (torch._lazy_clone) gets its own here
    (data_ptr() is PyTorch's mutable access; the allocator's copy callback copies)."""
    return record(t.untyped_storage())


def read_record(t: torch.Tensor) -> StorageRecord:
    """The record `t` reads: looked up by the const data address, so that a lazy clone
    keeps sharing its buffer, as on the CPU."""
    rec = _records.get(torch._C._data_address(t))
    return rec if rec is not None else record_of(t)


def empty_strided(shape, stride, dtype: torch.dtype, device: int, value=None) -> torch.Tensor:
    """A new pjrt tensor with its own storage, holding `value` (a flat buffer) or nothing."""
    jdtype = dtypes.buffer(dtype)
    dtypes.check_platform(dtype, client.platform())
    nbytes = views.span(shape, stride) * dtype.itemsize
    return new_tensor(shape, stride, dtype, jdtype, nbytes, device, value)


def new_tensor(shape, stride, dtype: torch.dtype, jdtype: np.dtype, nbytes: int, device: int,
               value) -> torch.Tensor:
    """empty_strided with everything precomputed: the executor's hot path."""
    memory.reserve(device, nbytes)
    try:
        return _native.new_tensor(shape, stride, dtype, device,
                                  StorageRecord(jdtype, nbytes, device, value), _records)
    except BaseException:
        memory.release(device, nbytes)
        raise


def live_records() -> list[StorageRecord]:
    return list(_records.values())


def live_handles() -> list[tuple[int, StorageRecord]]:
    """Every live storage's handle with its record."""
    return list(_records.items())


def holds(handle: int, rec: StorageRecord) -> bool:
    """Whether the storage `handle` is alive and still has the record `rec`."""
    return _records.get(handle) is rec


def wait_for_buffers(device: int | None, quiet: bool = False) -> None:
    """Block until every live computed buffer (on `device`, or all) is ready; `quiet`: a
    program that failed is not reported (exiting, it has nothing to wait for)."""
    for rec in live_records():
        value = rec.value  # (a graph.Lost, of a graph that failed, has nothing to wait for)
        if value is None or getattr(value, "pending", False) or \
                (device is not None and rec.device != device):
            continue
        try:
            value.block_until_ready()
        except Exception:
            if not quiet:
                raise


_zeros_cache: dict = {}


def _zeros(numel: int, dtype: np.dtype, device: int):
    key = (numel, dtype, device)
    fn = _zeros_cache.get(key)
    if fn is None:
        sharding = jax.sharding.SingleDeviceSharding(client.device(device))
        fn = _zeros_cache[key] = jax.jit(
            lambda: jnp.zeros((numel,), dtype), out_shardings=sharding
        )
    return fn()



