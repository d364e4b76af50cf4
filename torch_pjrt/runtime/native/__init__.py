"""Builds (once per machine) and loads the C++ runtime-hook shim."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

import torch

_SOURCE = os.path.join(os.path.dirname(__file__), "shim.cpp")
_NAME = "torch_pjrt_native"


def _build_dir() -> str:
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    # A build artifact, not part of the compile cache: it stays in the user's cache
    # directory whatever TORCH_PJRT_CACHE_DIR says.
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt", "native", tag)


def _import_so(path: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
    spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load() -> ModuleType:
    """The shim module, compiling it first if this machine has no build of it."""
    build_dir = _build_dir()
    so = os.path.join(build_dir, _NAME + ".so")
    if os.path.exists(so):
        return _import_so(so)
    os.makedirs(build_dir, exist_ok=True)
    from torch.utils import cpp_extension

    print("torch_pjrt: building the native runtime shim (once per machine, ~10 s)...",
          file=sys.stderr, flush=True)
    return cpp_extension.load(
        _NAME, [_SOURCE], build_directory=build_dir, extra_cflags=["-O2"], verbose=False
    )
