"""Hugging Face transformers on pjrt, through the settings it reads from the environment:
the Trainer's default device (ACCELERATE_TORCH_DEVICE) and its hub kernels (USE_HUB_KERNELS).

accelerate 1.16 already defaults to pjrt (it asks torch.accelerator), but transformers
5.25's TrainingArguments picks CUDA, a device it knows by name (mps, xpu, npu, hpu, neuron,
tpu...) or ACCELERATE_TORCH_DEVICE, else the CPU: without the variable a Trainer puts the
model on pjrt (accelerate's device) and the batches on the CPU (its own). The variable is set
when transformers' training_args module is imported, not at `import torch`: accelerate also
applies it under `cpu=True`, so setting it for every process would send accelerate scripts'
explicit CPU runs to pjrt. docs/ecosystem.md ("Trainer and accelerate") says why, and what
it costs: a Trainer's CPU run is asked for in the environment (ACCELERATE_USE_CPU=1).

transformers 5.25 "kernelizes" every model `from_pretrained` loads (hub kernels, on by
default), and the `kernels` library it requires refuses any device type outside its fixed
list: `from_pretrained(..., device_map="pjrt")` and `transformers serve --device pjrt` raise
`Unsupported device type 'pjrt'`. Hub kernels are binaries for CUDA, ROCm, XPU and other
named devices, none of which a pjrt model can run, so where pjrt is the process's
accelerator torch-pjrt turns them off with transformers' own switch when transformers'
modeling_utils is imported, unless the environment sets USE_HUB_KERNELS itself.

transformers' continuous batching (`generate_batch`, `transformers serve
--continuous-batching`) pads each batch's query and KV lengths to multiples of an interval
only where it captures CUDA graphs or compiles; otherwise every batch has shapes of its own,
and on pjrt every new shape is a new program (245 of them in `bench/first_call.py`'s
generate_batch of 3 prompts). Its model runner pads where its cache is on pjrt
(`pad_inputs`, with intervals of 64 query and 256 KV tokens where the configuration sets
none): 126 programs, the same tokens (docs/serving.md). TORCH_PJRT_HF_PADDING=0 turns it off.
"""

from __future__ import annotations

import functools
import os

from .. import _env
from .._after_import import after_import

DEVICE_VARIABLE = "ACCELERATE_TORCH_DEVICE"
KERNELS_VARIABLE = "USE_HUB_KERNELS"
_TRUE = ("1", "true", "yes", "y", "on")
PADDING_VARIABLE = "TORCH_PJRT_HF_PADDING"
Q_INTERVAL, KV_INTERVAL = 64, 256  # tokens; transformers' own fallbacks are 64 and 16384


def install(device_type: str) -> None:
    """Make `device_type` the Trainer's default device once transformers' TrainingArguments
    is imported."""
    after_import("transformers.training_args", lambda: default_trainer_device(device_type))
    after_import("transformers.modeling_utils", lambda: no_hub_kernels(device_type))
    after_import("transformers.generation.continuous_batching.model_runner",
                 lambda: pad_continuous_batching(device_type))


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


def no_hub_kernels(device_type: str) -> bool:
    """Set USE_HUB_KERNELS=0 where `device_type` is the process's accelerator and the
    environment does not set the variable; True if set."""
    if KERNELS_VARIABLE in os.environ:
        return False
    import torch

    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != device_type:
        return False
    os.environ[KERNELS_VARIABLE] = "0"
    return True


def pad_continuous_batching(device_type: str) -> bool:
    """Make continuous batching's model runner pad its batches where its KV cache is on
    `device_type` (unless TORCH_PJRT_HF_PADDING=0); True if installed. A transformers
    without the runner's `pad_inputs` switch is left alone."""
    from transformers.generation.continuous_batching import model_runner

    runner = getattr(model_runner, "ModelRunner", None)
    if runner is None or getattr(runner, "_pjrt_padding", False):
        return False
    init = runner.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        device = getattr(getattr(self, "cache", None), "device", None)
        if getattr(device, "type", None) != device_type or getattr(self, "pad_inputs", True) \
                or not _env.flag(PADDING_VARIABLE):
            return
        config = self.cb_config
        config.q_padding_interval_size = config.q_padding_interval_size or Q_INTERVAL
        config.kv_padding_interval_size = config.kv_padding_interval_size or KV_INTERVAL
        self.pad_inputs = True

    runner.__init__ = __init__
    runner._pjrt_padding = True
    return True
