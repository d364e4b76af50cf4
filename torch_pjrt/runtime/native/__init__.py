"""Loads the C++ extension that setup.py built at install time (it never compiles here),
after checking that it was built for the torch installed and from the sources beside it."""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
from types import ModuleType

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = ("reinstall torch-pjrt (from a checkout: pip install -e . , or after a change to "
            "the C++ files: python setup.py build_ext --inplace)")


def source_digest(paths: list[str]) -> str:
    """The digest of the native sources, as setup.py computes it at build time."""
    h = hashlib.sha256()
    for path in sorted(paths, key=os.path.basename):
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _sources() -> list[str]:
    return glob.glob(os.path.join(_HERE, "*.cpp")) + glob.glob(os.path.join(_HERE, "*.h"))


def check_build(info: ModuleType | None) -> None:
    """Raise ImportError, saying what to do, unless `info` (the module _build_info that
    setup.py writes next to the library) matches the installed torch and the sources."""
    if info is None:
        raise ImportError(f"torch_pjrt: the native extension is not built in {_HERE}: "
                          f"{_REBUILD}")
    if info.TORCH != torch.__version__:
        raise ImportError(
            f"torch_pjrt: the native extension was built against torch {info.TORCH} and torch "
            f"{torch.__version__} is installed: install torch=={info.TORCH}, or {_REBUILD} so "
            "that it builds against this torch")
    sources = _sources()
    if sources and source_digest(sources) != info.SOURCES:
        raise ImportError(f"torch_pjrt: the C++ sources in {_HERE} changed after the native "
                          f"extension was built: {_REBUILD}")


def load() -> ModuleType:
    """The native extension module (torch_pjrt.runtime.native._C)."""
    try:
        info = importlib.import_module(f"{__name__}._build_info")
    except ModuleNotFoundError:
        info = None
    check_build(info)
    return importlib.import_module(f"{__name__}._C")
