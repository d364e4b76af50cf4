"""Every difference between the torch (and JAX) releases torch-pjrt supports, in one place:
each a small named function or constant with the reason it exists (docs/compatibility.md)."""

from __future__ import annotations

import functools

import torch
from torch._ops import OpOverload

_aten = torch.ops.aten


def torch_release() -> tuple[int, int]:
    """(major, minor) of the installed torch, for the choices below only."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def aten_overloads(*names: str) -> list[OpOverload]:
    """The overloads ("op.overload") this torch has, leaving out those a release removed:
    aten::cholesky (torch.cholesky, deprecated since 1.9 for torch.linalg.cholesky) is gone
    from torch 2.14 on. A lowering of such an op registers where the op exists."""
    found = []
    for name in names:
        op, _, overload = name.partition(".")
        packet = getattr(_aten, op, None)
        if packet is not None and overload in packet.overloads():
            found.append(getattr(packet, overload))
    return found


def xla_options(options: dict) -> dict:
    """The XLA compiler options among `options` that this jaxlib's XLA knows, the others left
    out: XLA drops a debug option once the behaviour it chose is the only one, and compiling
    with an option it no longer has fails (INVALID_ARGUMENT: No such compile option).
    xla_cpu_use_fusion_emitters (the older XLA:CPU loop emitters when False) is there in
    jaxlib 0.10 and gone in 0.12. Each name is asked once per process, by compiling a
    one-op program with it."""
    return {name: value for name, value in options.items() if _xla_knows(name, value)}


@functools.cache
def _xla_knows(name: str, value) -> bool:
    import jax
    import numpy as np

    try:
        jax.jit(lambda x: x + 1).lower(np.float32(0)).compile(compiler_options={name: value})
    except Exception as e:  # noqa: BLE001 - jaxlib's error type moved between releases
        if "No such compile option" in str(e):
            return False
        raise
    return True


def c10d_backend_not_recorded(name: str) -> None:
    """torch 2.15 attaches a Flight Recorder hook (FlightRecorderHook) to each new process
    group whose backends do not record collectives themselves, and skips a group with no
    backend registered on it (a backend creator's ProcessGroup subclass, which it cannot
    record). The `pjrt` group is such a subclass, but it registers gloo for its CPU
    tensors: the hook is attached, finds no default backend, and init_process_group raises
    ("Could not find the default backend type 0 for Process Group with name pjrt").
    Named among the backends that record themselves, the group is skipped as torch skips
    other subclasses. torch 2.13 and 2.14 attach no such hook (the set does not exist)."""
    from torch.distributed import distributed_c10d

    self_recording = getattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if self_recording is not None:
        self_recording.add(name)


@functools.cache
def repeat_interleave_refusal(dtype: torch.dtype) -> tuple[type, str] | None:
    """The CPU kernel's refusal of `dtype` as `torch.repeat_interleave(repeats)`'s repeats
    (its exception type and message), None where it takes it: torch 2.13 takes int32 and
    int64 only, 2.14 every integer dtype (uint8, int8, int16 too). Asked of the CPU once per
    dtype, on a one-element tensor."""
    try:
        torch.repeat_interleave(torch.ones(1, dtype=dtype))
    except Exception as e:  # noqa: BLE001 - the CPU's own error, raised again on pjrt
        return type(e), str(e)
    return None
