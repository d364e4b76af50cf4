"""What Dynamo must know of pjrt, told once Dynamo is imported (compile/__init__'s start).

Dynamo and Inductor take seconds to import (2.7 s of a first pjrt op, when this ran at
start): a process that never compiles never imports them, and the compiler itself
(backend.py) is imported at the first graph it compiles.
"""

from __future__ import annotations

import functools
import importlib.util
import pkgutil

import torch


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs: list):
    """backend.py's compiler, imported at the first graph of pjrt tensors the default
    backend hands over."""
    from . import backend

    return backend.pjrt_backend(gm, example_inputs)


def register() -> None:
    """Tell Dynamo what it must not trace, and make the default backend (Inductor, which
    has no code generator for this device) hand graphs of pjrt tensors to "pjrt". Runs
    right after `torch._dynamo`'s own code, which may be inside another module's import
    (torch._functorch.aot_autograd imports Dynamo half-way through): it imports nothing
    that torch._dynamo did not, so it never meets a half-imported module. Dynamo finds the
    "pjrt" backend by name through the `torch_dynamo_backends` entry point (its list of
    backends imports every backend module, aot_autograd's users among them: not here)."""
    from torch._dynamo import trace_rules

    # The backend's own Python (dispatcher kernels, the executor, the runtime) runs when
    # compiled code falls back to eager, e.g. during loss.backward() in a compiled step;
    # Dynamo must run it, not try to compile it. (demo/ stays traceable: it is user code.)
    for part in ("runtime", "storage", "eager", "lowering", "compile", "counters", "_env"):
        trace_rules.add(f"torch_pjrt.{part}")
    # torch_pjrt.kernels' machinery, not its examples (user-facing functions, traced).
    kernels = importlib.util.find_spec("torch_pjrt.kernels").submodule_search_locations
    for module in pkgutil.iter_modules(kernels):
        if module.name != "examples":
            trace_rules.add(f"torch_pjrt.kernels.{module.name}")
    for package in ("jax", "jaxlib", "ml_dtypes"):  # what those kernels call
        trace_rules.add(package)
    wrapper = torch._TorchCompileInductorWrapper
    if not getattr(wrapper.__call__, "_pjrt", False):
        inductor_call = wrapper.__call__

        @functools.wraps(inductor_call)
        def call(self, model_, inputs_, **kwargs):
            if any(isinstance(t, torch.Tensor) and t.device.type == "pjrt" for t in inputs_):
                return pjrt_backend(model_, inputs_)
            return inductor_call(self, model_, inputs_, **kwargs)

        call._pjrt = True
        wrapper.__call__ = call
