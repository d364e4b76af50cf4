"""What the settings say about the platform before PJRT starts, without importing JAX.

`import torch` autoloads torch-pjrt, and a script that never touches the device must not
pay for JAX's import (about 0.6 s) or start a client: the device count the autograd engine
asks for, whether XLA:CPU is the platform, and the steps the upper layers want run before
the client starts are all answered here from the environment. client.py starts PJRT.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable

from .. import _env

# Steps that must run before JAX starts the PJRT client, registered by upper layers:
# distributed/ brings up JAX's multi-process runtime there when torchrun's variables say
# the job has several processes. A step returns None, or the JAX process indices whose
# devices are pjrt:0, pjrt:1, ... in this process (the processes on this host, in local
# rank order: pjrt:LOCAL_RANK is this process's own device, as cuda:LOCAL_RANK is).
before_start: list[Callable[[], list[int] | None]] = []
# How many devices the client will list, where an upper layer knows it before the client
# starts (distributed/: a torchrun job's processes on this host, one device each), or None.
count_hints: list[Callable[[], int | None]] = []


def known_count() -> int | None:
    """How many devices the client lists, said without starting it where only the settings
    decide it: on the cpu platform, one per process of a torchrun job on this host, else
    jax_num_cpu_devices or XLA's --xla_force_host_platform_device_count (or 1). None where
    only starting the client tells (an accelerator's plugin). The autograd engine and
    torch.accelerator ask the count: a CPU-only script must not start PJRT, nor import JAX."""
    client = sys.modules.get(__package__ + ".client")
    if client is not None and client.started():
        return client.device_count()
    if not cpu_platform():
        return None
    for hint in count_hints:
        n = hint()
        if n is not None:
            return n
    n = _num_cpu_devices()
    if n is not None and n >= 0:
        return n
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)",
                      os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else 1


def _num_cpu_devices() -> int | None:
    """JAX's jax_num_cpu_devices: its config where JAX is imported (a script may have set
    it), else the environment variable JAX reads it from."""
    jax = sys.modules.get("jax")
    if jax is not None:
        return jax.config.jax_num_cpu_devices
    value = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def cpu_platform() -> bool:
    """Whether the client's devices will be XLA:CPU's: TORCH_PJRT_PLATFORM=cpu, or no
    platform named and no accelerator plugin for JAX to prefer."""
    platform = _env.get("TORCH_PJRT_PLATFORM").strip().lower()
    return platform == "cpu" or (not platform and not accelerator_plugins())


@functools.cache
def accelerator_plugins() -> bool:
    """Whether JAX could find a non-CPU PJRT plugin (so it may not pick the CPU)."""
    import importlib.metadata
    import pkgutil

    named = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if named:
        return named.split(",")[0].strip() != "cpu"
    try:
        import jax_plugins  # namespace package of PJRT plugins
        if any(True for _ in pkgutil.iter_modules(jax_plugins.__path__)):
            return True
    except ImportError:
        pass
    return bool(importlib.metadata.entry_points(group="jax_plugins"))
