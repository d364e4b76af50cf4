"""Builds (once per machine) and loads the C++ runtime-hook shim."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
from types import ModuleType

import torch

_SOURCES = [os.path.join(os.path.dirname(__file__), name)
            for name in ("shim.cpp", "op_kernel.cpp", "cpu_kernels.cpp")]
_HEADERS = [os.path.join(os.path.dirname(__file__), "shim.h")]
_NAME = "torch_pjrt_native"


def _build_dir() -> str:
    h = hashlib.sha256()
    for source in _SOURCES + _HEADERS:
        with open(source, "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()[:16]
    # cpu_kernels.cpp is built against jaxlib's FFI headers
    import jaxlib  # imported by jax already

    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    tag = f"torch{torch.__version__}-jaxlib{jaxlib.__version__}-py{py}-{digest}"
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


def _arch_flags() -> list[str]:
    """x86-64 builds of torch compile their ATen kernels for AVX2 and AVX-512, which
    shapes the kernels' dispatch stubs; cpu_kernels.cpp calls stubs only where it knows
    their layout."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ["-DHAVE_AVX512_CPU_DEFINITION", "-DHAVE_AVX2_CPU_DEFINITION",
                "-DTORCH_PJRT_ATEN_STUBS"]
    return []


def load() -> ModuleType:
    """The shim module, compiling it first if this machine has no build of it."""
    build_dir = _build_dir()
    so = os.path.join(build_dir, _NAME + ".so")
    if os.path.exists(so):
        return _import_so(so)
    os.makedirs(build_dir, exist_ok=True)
    import jax
    from torch.utils import cpp_extension

    print("torch_pjrt: building the native runtime shim (once per machine, ~30 s)...",
          file=sys.stderr, flush=True)
    return cpp_extension.load(
        _NAME, _SOURCES, build_directory=build_dir, extra_cflags=["-O2", *_arch_flags()],
        extra_include_paths=[jax.ffi.include_dir()],  # XLA's FFI headers (cpu_kernels.cpp)
        extra_ldflags=["-ldl"], verbose=False,
    )
