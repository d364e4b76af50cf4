"""An op's failures as PyTorch reports them: devices that differ, a lowering or a launch
that fails, device memory running out."""

from __future__ import annotations

import torch

from .opspec import OpSpec


class ExecutionError(RuntimeError):
    """The executor's own invariant broken (not an error of the op's arguments)."""


def device_mismatch(spec: OpSpec, a: torch.device, b: torch.device) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}! (when checking arguments for {spec.op})"
    )


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
