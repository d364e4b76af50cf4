"""Hugging Face Trainer: pjrt as its default device, as accelerate's, through the one setting
transformers reads for a device it does not know by name (ACCELERATE_TORCH_DEVICE).

accelerate 1.16 already defaults to pjrt (it asks torch.accelerator), but transformers
5.25's TrainingArguments picks CUDA, a device it knows by name (mps, xpu, npu, hpu, neuron,
tpu...) or ACCELERATE_TORCH_DEVICE, else the CPU: without the variable a Trainer puts the
model on pjrt (accelerate's device) and the batches on the CPU (its own). The variable is set
when transformers' training_args module is imported, not at `import torch`: accelerate also
applies it under `cpu=True`, so setting it for every process would send accelerate scripts'
explicit CPU runs to pjrt. docs/ecosystem.md ("Trainer and accelerate") says why, and what
it costs: a Trainer's CPU run is asked for in the environment (ACCELERATE_USE_CPU=1).
"""

from __future__ import annotations

import os

from .._after_import import after_import

DEVICE_VARIABLE = "ACCELERATE_TORCH_DEVICE"
_TRUE = ("1", "true", "yes", "y", "on")


def install(device_type: str) -> None:
    """Make `device_type` the Trainer's default device once transformers' TrainingArguments
    is imported."""
    after_import("transformers.training_args", lambda: default_trainer_device(device_type))


def default_trainer_device(device_type: str) -> bool:
    """Set ACCELERATE_TORCH_DEVICE to `device_type` unless the environment already names a
    device or asks for the CPU (ACCELERATE_USE_CPU, as `accelerate launch --cpu` sets it);
    True if set."""
    if DEVICE_VARIABLE in os.environ:
        return False
    if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _TRUE:
        return False
    os.environ[DEVICE_VARIABLE] = device_type
    return True
