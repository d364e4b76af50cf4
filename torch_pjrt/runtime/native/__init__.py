"""Builds (once per machine) and loads the C++ runtime-hook shim."""

from __future__ import annotations

import atexit
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
from types import ModuleType

import torch

_SOURCES = [os.path.join(os.path.dirname(__file__), name)
            for name in ("shim.cpp", "op_kernel.cpp", "profiler.cpp", "cpu_kernels.cpp",
                         "autocast.cpp")]
_HEADERS = [os.path.join(os.path.dirname(__file__), "shim.h")]
_NAME = "torch_pjrt_native"


def _base_dir() -> str:
    # A build artifact, not part of the compile cache: it stays in the user's cache
    # directory whatever TORCH_PJRT_CACHE_DIR says.
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt")


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
    return os.path.join(_base_dir(), "native", tag)


def _private_build_dir() -> str:
    """The build directory, where it is this user's alone (the shim is loaded into the
    process: whoever can write there runs code in it); else a fresh private one, with a
    warning (this process builds the shim again)."""
    from ..cache_files import private_dir, private_file, warn_once

    build_dir = _build_dir()
    reason = private_dir(build_dir, _base_dir())
    so = os.path.join(build_dir, _NAME + ".so")
    if reason is None and os.path.lexists(so):
        reason = private_file(so)
    if reason is None:
        return build_dir
    warn_once("refused", "native build", f"pjrt: the native shim's build directory is not "
              f"used: {reason}; it is built in a private temporary directory instead")
    private = tempfile.mkdtemp(prefix="torch_pjrt_native-")
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    return private


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


def _kineto_flags() -> tuple[list[str], list[str]]:
    """(cflags, include paths) for profiler.cpp: the Kineto headers torch ships, where this
    build of torch has Kineto (the profiler then sees the device)."""
    include = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")
    if not os.path.isfile(os.path.join(include, "IActivityProfiler.h")):
        return [], []
    return ["-DUSE_KINETO"], [include]


def load() -> ModuleType:
    """The shim module, compiling it first if this machine has no build of it."""
    build_dir = _private_build_dir()
    so = os.path.join(build_dir, _NAME + ".so")
    if os.path.exists(so):
        return _import_so(so)
    import jax
    from torch.utils import cpp_extension

    print("torch_pjrt: building the native runtime shim (once per machine, ~30 s)...",
          file=sys.stderr, flush=True)
    kineto_cflags, kineto_include = _kineto_flags()
    return cpp_extension.load(
        _NAME, _SOURCES, build_directory=build_dir,
        extra_cflags=["-O2", *_arch_flags(), *kineto_cflags],
        # XLA's FFI headers (cpu_kernels.cpp), Kineto's (profiler.cpp)
        extra_include_paths=[jax.ffi.include_dir(), *kineto_include],
        extra_ldflags=["-ldl"], verbose=False,
    )
