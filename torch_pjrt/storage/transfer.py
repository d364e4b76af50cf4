"""Host <-> device transfers: CPU tensors to XLA buffers and back."""

from __future__ import annotations

import weakref

import jax
import numpy as np
import torch

from .. import counters
from ..runtime import client, device_trace, watch
from . import dtypes

# numpy has no bfloat16/float8: move those as same-width integers and reinterpret.
_CARRIER = {
    torch.bfloat16: torch.int16,
    torch.float16: None,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
    torch.uint16: None,
}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor as a numpy array with the matching JAX dtype (complex64 for
    complex32, which numpy lacks: the dtype a program computes it in)."""
    if t.dtype is torch.complex32:
        return t.to(torch.complex64).numpy()
    carrier = _CARRIER.get(t.dtype)
    if carrier is not None:
        return t.view(carrier).numpy().view(dtypes.to_jax(t.dtype))
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A numpy array (any JAX dtype) as a CPU tensor that owns a copy of its data."""
    dtype = dtypes.to_torch(a.dtype)
    carrier = _CARRIER.get(dtype)
    if carrier is not None:
        a = a.view(dtypes.to_jax(carrier))
        return torch.from_numpy(np.array(a, copy=True)).view(dtype)
    return torch.from_numpy(np.array(a, copy=True))


def host_to_device(t: torch.Tensor, device: int) -> jax.Array:
    """A flat device buffer holding the elements of CPU tensor `t` in row-major order."""
    t = t.detach().resolve_conj().resolve_neg()
    counters.count("host_to_device_bytes", t.numel() * t.element_size())
    # The transfer is asynchronous and reads the host memory later: give it a private
    # copy, so the caller may modify its CPU tensor right away. torch copies `t` into
    # memory numpy owns: t.numpy() would tie the caller's storage to numpy and make it
    # no longer resizable (its out= and resize_ would then fail on the CPU).
    if t.dtype is torch.complex32:  # its float16 parts (storage/dtypes.py)
        t = torch.view_as_real(t)
    carrier = _CARRIER.get(t.dtype)
    source = t.view(carrier) if carrier is not None else t
    host = np.empty(t.numel(), dtypes.to_jax(source.dtype))  # 1-d: any number of dims
    torch.from_numpy(host).view(t.shape).copy_(source)
    if carrier is not None:
        host = host.view(dtypes.to_jax(t.dtype))
    if watch.profiling:
        return _traced_put(host, device)
    return jax.device_put(host, client.device(device), may_alias=False)


def _fetch(buf: jax.Array) -> np.ndarray:
    """A device buffer's contents on the host (a synchronization: waits for it)."""
    watch.synced("copy to host")
    a = _traced_get(buf) if watch.profiling else np.asarray(buf)
    counters.count("device_to_host_bytes", a.nbytes)
    return a


def device_to_host(buf: jax.Array, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor with the contents of a dense device buffer (waits for it); `dtype`
    where the buffer holds it in another (complex32: its float16 parts)."""
    t = from_numpy(_fetch(buf))
    if dtype is not None and dtype != t.dtype:  # (an empty numpy array has stride 0)
        t = t.view(dtype) if t.numel() else torch.empty(0, dtype=dtype)
    return t.reshape(shape)


# The last buffer element_to_host copied, and its host copy: reading a tensor's elements one
# by one (iterating it, Python's all() over it) copies its storage once, not once an element.
_last_host: tuple = (lambda: None, None)


def element_to_host(buf: jax.Array, index: int):
    """Element `index` of a flat device buffer as a Python number (waits for it). The whole
    buffer comes to the host, and is kept for the next read while `buf` lives: XLA buffers
    are immutable (a write to a storage gives it a new buffer), so the copy cannot go stale."""
    global _last_host
    ref, host = _last_host
    if ref() is not buf:
        host = _fetch(buf)
        _last_host = (weakref.ref(buf), host)
    else:
        watch.synced("copy to host")  # (a read the user waits on, as any)
    return host[index].item()


def _traced_put(host: np.ndarray, device: int) -> jax.Array:
    """host_to_device under a profile: the transfer ends when its buffer is ready."""
    start = device_trace.now()
    buf = jax.device_put(host, client.device(device), may_alias=False)
    device_trace.run("pjrt host to device", device, start, [buf], {"bytes": host.nbytes},
                     device_trace.TRANSFER)
    return buf


def _traced_get(buf: jax.Array) -> np.ndarray:
    """np.asarray(buf) under a profile: the wait for the program computing `buf` (a sync),
    then the copy."""
    start = device_trace.now()
    buf.block_until_ready()
    device_trace.host("pjrt sync: copy to host", start)
    copied = device_trace.now()
    a = np.asarray(buf)
    device = client.devices().index(next(iter(buf.devices())))
    device_trace.done("pjrt device to host", device, copied, {"bytes": a.nbytes})
    return a
