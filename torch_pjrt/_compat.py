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


def compile_lowered(lowered, options: dict):
    """`lowered` (a jax.stages.Lowered) compiled with the XLA options among `options` that
    this jaxlib's XLA knows. Asked with all of them first: where XLA knows them all (jaxlib
    0.10 and every option torch-pjrt sets), nothing is probed (xla_options' probes cost a
    process 25 ms an option); where it names one it lacks, the known ones are found and
    asked again."""
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=options)
    except Exception as e:  # noqa: BLE001 - jaxlib's error type moved between releases
        if "No such compile option" not in str(e):
            raise
    known = xla_options(options)
    return lowered.compile(compiler_options=known) if known else lowered.compile()


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


_DEFERRED_DISABLES: list = []  # functions marked by defer_dynamo_import, until Dynamo's import


def defer_dynamo_import() -> None:
    """PyTorch wraps its Python reference and meta kernels (add, exp, softmax... on meta
    tensors: what fused eager's meta pass runs) in `torch._compile._disable_dynamo`, whose
    first call imports torch._dynamo (and Inductor with it: 0.75 s on the 2-core Xeon,
    3.5 s at load) to build the wrapper that keeps Dynamo from tracing them. Native CPU
    eager runs no such kernel; a pjrt process paid that import at its first op. Before
    Dynamo is imported nothing can trace anything, so until then each wrapped function is
    marked as its own disabled form (the wrapper reads the mark from `__dynamo_disable`),
    and the marks are taken back once Dynamo's module has run, so that the wrappers build
    Dynamo's own from then on (compile.start's hook runs then too). Only where this torch's
    wrapper reads that mark; functions wrapped after this call keep importing Dynamo."""
    import gc
    import sys
    import types

    from ._after_import import after_import

    if "torch._dynamo" in sys.modules:
        return
    probe = getattr(getattr(torch, "_compile", None), "_disable_dynamo", None)
    code = getattr(probe(lambda: None), "__code__", None) if probe is not None else None
    if code is None or "__dynamo_disable" not in code.co_consts or \
            "fn" not in code.co_freevars:
        return
    slot = code.co_freevars.index("fn")
    # the wrappers are the functions whose code is the wrapper's (a C-level scan: half
    # the time of a Python loop over gc.get_objects())
    for obj in gc.get_referrers(code):
        if type(obj) is types.FunctionType:
            fn = obj.__closure__[slot].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                try:
                    setattr(fn, "__dynamo_disable", fn)
                except (AttributeError, TypeError):
                    continue
                _DEFERRED_DISABLES.append(fn)
    after_import("torch._dynamo", _undefer_dynamo_import)


def _undefer_dynamo_import() -> None:
    for fn in _DEFERRED_DISABLES:
        if getattr(fn, "__dynamo_disable", None) is fn:
            delattr(fn, "__dynamo_disable")
    _DEFERRED_DISABLES.clear()
