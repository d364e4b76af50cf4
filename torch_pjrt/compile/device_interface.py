"""Dynamo's DeviceInterface for pjrt: how torch.compile's machinery asks the device for its
index, streams, events and properties (torch._dynamo.device_interface)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

from .. import runtime


def _pjrt():
    return torch.pjrt


class PjrtInterface(DeviceInterface):
    """torch.pjrt behind Dynamo's device-agnostic calls. One queue of work per device:
    the default stream is the only one, and its raw handle is 0."""

    device = torch.pjrt.device
    Event = torch.pjrt.Event
    Stream = torch.pjrt.Stream

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            _pjrt().set_device(device)

        @staticmethod
        def current_device() -> int:
            return _pjrt().current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return _pjrt().get_device_properties(device)

    @staticmethod
    def current_device() -> int:
        return _pjrt().current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        _pjrt().set_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = _pjrt().current_device()
        _pjrt().set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        if device < 0:
            return _pjrt().current_device()
        return PjrtInterface.exchange_device(device)

    @staticmethod
    def device_count() -> int:
        return _pjrt().device_count()

    @staticmethod
    def is_available() -> bool:
        """Whether pjrt devices are in use: True once PJRT has started. Inductor asks every
        registered device this before it forks its compile workers, and compiling CPU code
        must not start PJRT (JAX's threads would go into the forked workers)."""
        return runtime._initialized and _pjrt().device_count() > 0

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return _pjrt().stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return _pjrt().current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        if stream.device.type != runtime.DEVICE_TYPE:
            raise ValueError(f"pjrt: set_stream takes a pjrt stream, got one of {stream.device}")

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        pass  # the default stream is the only one

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        _pjrt().synchronize(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        return ""  # no CUDA-style version; see torch.pjrt.get_device_capability()

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return _pjrt().is_bf16_supported(including_emulation)

    @classmethod
    def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return dtype in _pjrt().get_device_capability()["supported_dtypes"]

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return _pjrt().memory_allocated(device)


def register() -> None:
    register_interface_for_device(runtime.DEVICE_TYPE, PjrtInterface)


# Importing this module registers the interface: compile/__init__'s hook on Dynamo's module
# imports it, and where this module is imported first, its own import of Dynamo's module
# runs that hook while this one is half done (the hook's import then does nothing).
register()
