"""An op's failures as PyTorch reports them: devices that differ, a lowering or a launch
that fails, device memory running out."""

from __future__ import annotations

import torch

from .opspec import OpSpec


class ExecutionError(RuntimeError):
    """The executor's own invariant broken (not an error of the op's arguments)."""


def device_mismatch(spec: OpSpec, a: torch.device, b: torch.device,
                    values: list | None = None) -> RuntimeError:
    own = _OWN_DEVICE_CHECKS.get(str(spec.op))
    if own is not None and values:
        return RuntimeError(own(values))
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}! (when checking arguments for {spec.op})"
    )


def _block_diag_devices(values: list) -> str:
    tensors = values[0]
    first = tensors[0].device
    i = next(i for i, t in enumerate(tensors) if t.device != first)
    return ("torch.block_diag: input tensors must all be on the same device. Input 0 is on "
            f"device {first} and input {i} is on device {tensors[i].device}.")


# Ops whose kernels check their tensors' devices themselves, with their own message, before
# the dispatcher's generic one could (device_check: NoCheck in native_functions.yaml).
_OWN_DEVICE_CHECKS = {"aten.block_diag.default": _block_diag_devices}


def runtime_error(spec: OpSpec, e: Exception) -> Exception:
    """A lowering's or an XLA launch's exception as the op's PyTorch error."""
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "Out of memory" in text:
        return torch.OutOfMemoryError(f"pjrt: out of device memory running {spec.op}: {text}")
    if type(e).__module__ == "builtins" and not isinstance(e, ExecutionError):
        # raised by the lowering itself (NotImplementedError, IndexError, ...): keep the type
        try:
            return type(e)(f"{spec.op}: {text}")
        except TypeError:
            pass
    return RuntimeError(f"pjrt: {spec.op} failed on the device: {text}")
