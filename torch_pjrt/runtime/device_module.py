"""`torch.pjrt`: the device module, named like torch.cuda's functions."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device",
    "device", "synchronize", "get_device_name", "get_device_properties",
    "manual_seed", "manual_seed_all", "seed",
    "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all",
    "set_rng_state_all", "default_generators", "memory_allocated", "max_memory_allocated",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "memory_stats",
    "memory_reserved", "max_memory_reserved", "mem_get_info", "empty_cache",
    "get_device_capability",
    "get_amp_supported_dtype", "is_bf16_supported", "Stream", "Event", "current_stream",
    "default_stream", "stream",
]


def _runtime():
    from .. import runtime

    runtime.ensure_initialized()
    return runtime


def _index(device: Any = None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else current_device()


def is_available() -> bool:
    """Whether a pjrt device exists (PJRT starts only if it must to say: runtime.available)."""
    from .. import runtime

    return runtime.available()


def is_initialized() -> bool:
    from .. import runtime

    return runtime._initialized


def init() -> None:
    _runtime()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    _runtime()
    from . import client

    return client.device_count()


def current_device() -> int:
    return _runtime().shim().current_device()


def set_device(device: Any) -> None:
    _runtime().shim().set_device(_index(device))


class device(contextlib.ContextDecorator):
    """Context manager that makes `device` the current pjrt device."""

    def __init__(self, device: Any):
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


def synchronize(device: Any = None) -> None:
    """Wait until all work queued on the device has finished."""
    _runtime()
    from . import sync

    sync.synchronize(None if device is None else _index(device))


def get_device_name(device: Any = None) -> str:
    _runtime()
    from . import client

    d = client.device(_index(device))
    return f"{d.platform}:{d.device_kind}"


class DeviceProperties(NamedTuple):
    """What torch.cuda.get_device_properties() gives that a PJRT device has."""

    name: str
    type: str
    total_memory: int


def get_device_properties(device: Any = None) -> DeviceProperties:
    """Name, platform and bytes torch-pjrt may hold (TORCH_PJRT_MEMORY_LIMIT or the device's
    own limit) of a pjrt device."""
    _runtime()
    from . import client, memory

    index = _index(device)
    d = client.device(index)
    return DeviceProperties(f"{d.platform}:{d.device_kind}", d.platform,
                            memory.device(index).limit)


# ----------------------------------------------------------------------- RNG
def default_generators() -> tuple[torch.Generator, ...]:
    native = _runtime().shim()
    return tuple(native.default_generator(i) for i in range(device_count()))


def _generator(device: Any = None) -> torch.Generator:
    return _runtime().shim().default_generator(_index(device))


# Seeding before PJRT has started waits for it (as torch.cuda's seeding waits for CUDA):
# torch.manual_seed() seeds every device, and a CPU-only script, or each DataLoader worker,
# must not start PJRT by seeding the CPU.
_queued: list[Callable[[], None]] = []


def _seed_when_started(step: Callable[[], None]) -> None:
    from .. import runtime

    if runtime._initialized:
        step()
    else:
        _queued.append(step)


def apply_queued_seeds() -> None:
    """Run the seeding asked for before PJRT started (runtime.ensure_initialized does)."""
    while _queued:
        _queued.pop(0)()


def _thread_device() -> int:
    from .. import runtime

    return runtime.shim().current_device()  # (starts nothing)


def manual_seed(seed: int) -> None:
    index = _thread_device()
    _seed_when_started(lambda: _generator(index).manual_seed(int(seed)))


def manual_seed_all(seed: int) -> None:
    _seed_when_started(lambda: [g.manual_seed(int(seed)) for g in default_generators()])


def seed() -> None:
    index = _thread_device()
    _seed_when_started(lambda: _generator(index).seed())


def seed_all() -> None:
    _seed_when_started(lambda: [g.seed() for g in default_generators()])


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: Any = "pjrt") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "pjrt") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, s in zip(default_generators(), new_states):
        g.set_state(s)


# -------------------------------------------------------------------- memory
# As torch.cuda's, these read nothing before the device has started (zero, or no
# statistics) and start nothing; torch.accelerator's memory calls reach the same account
# through the native allocator (runtime/native/shim.cpp), so both give the same numbers.
def _account(device: Any):
    """(the memory account, the device index), or None before PJRT has started."""
    if not is_initialized():
        return None
    from . import memory

    return memory, _index(device)


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live pjrt storages on the device."""
    found = _account(device)
    return found[0].allocated(found[1]) if found else 0


def max_memory_allocated(device: Any = None) -> int:
    """The most bytes live pjrt storages have held since the start or the last
    reset_peak_memory_stats()."""
    found = _account(device)
    return found[0].peak(found[1]) if found else 0


def memory_reserved(device: Any = None) -> int:
    """The same as memory_allocated(): torch-pjrt keeps no cache of freed buffers."""
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    """The same as max_memory_allocated() (see memory_reserved)."""
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    found = _account(device)
    if found:
        memory, index = found
        memory.reset_peak(index)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    found = _account(device)
    if found:
        memory, index = found
        memory.reset_accumulated(index)


def memory_stats(device: Any = None) -> dict[str, int]:
    """torch.cuda.memory_stats()'s keys ("allocated_bytes.all.peak", "num_ooms", ...), with
    the values torch.accelerator.memory_stats() gives (runtime/memory.py says what each
    means for XLA buffers); empty before the device has started."""
    found = _account(device)
    if not found:
        return {}
    memory, index = found
    return memory.flat_stats(index)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes: what torch-pjrt may still allocate on the device before
    torch.OutOfMemoryError, and its limit (TORCH_PJRT_MEMORY_LIMIT or the device's own)."""
    _runtime()
    from . import memory

    return memory.memory_info(_index(device))


def empty_cache() -> None:
    """Free device memory no tensor uses: XLA frees buffers as soon as they die, so this
    only collects the tensors in reference cycles."""
    from . import memory

    memory.empty_cache()


# ---------------------------------------------------------------- capability
_dtypes: frozenset[torch.dtype] = frozenset()


def set_supported_dtypes(dtypes: frozenset[torch.dtype]) -> None:
    """What the device can hold (set by the storage layer when PJRT starts)."""
    global _dtypes
    from .. import runtime

    _dtypes = frozenset(dtypes)
    runtime.shim().set_supported_dtypes(sorted(_dtypes, key=str))


def get_device_capability(device: Any = None) -> dict[str, Any]:
    """{"supported_dtypes": the dtypes a tensor on the device can have}, as
    torch.accelerator.get_device_capability() reports it (the platform's: TPU has no
    float64). A PJRT device has no compute capability version like CUDA's (major, minor)."""
    _runtime()  # starting PJRT sets the dtypes
    from . import client

    client.device(_index(device))  # a valid index
    return {"supported_dtypes": set(_dtypes)}


# ------------------------------------------------------------------ autocast
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ------------------------------------------------------------------- streams
# A PJRT device runs one queue of work in order: the default stream is the only
# one, and waiting for a stream or event waits for the device.
class Stream(torch.Stream):
    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=torch.device("pjrt", _index(device)), priority=priority)


class _EventType(type(torch.Event)):
    """isinstance(e, torch.pjrt.Event): any torch.Event of the pjrt device."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "pjrt"


class Event(torch.Event, metaclass=_EventType):
    """An event of the pjrt device: a plain torch.Event (PyTorch's elapsed_time takes no
    subclass of it). With enable_timing=True, record() waits for the work queued before
    it and keeps the time then, and elapsed_time() gives the milliseconds between two."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        return torch.Event(device="pjrt", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device: Any = None) -> torch.Stream:
    return torch.Stream(device=torch.device("pjrt", _index(device)))


def default_stream(device: Any = None) -> torch.Stream:
    return current_stream(device)


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    yield s


# ------------------------------------------------------- legacy typed storages
# torch.pjrt.FloatStorage... (deprecated with TypedStorage, kept as torch.cuda keeps them):
# what Tensor.storage_type() returns for a pjrt tensor, and an isinstance check of its storage.
from .legacy_storage import CLASSES as _LEGACY_STORAGES  # noqa: E402

globals().update(_LEGACY_STORAGES)
__all__ += list(_LEGACY_STORAGES)
