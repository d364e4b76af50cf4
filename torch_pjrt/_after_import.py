"""Run a step right after a module of another library is first imported (or now, if it is
already): how torch-pjrt registers with registries that `import torch` does not load."""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

_waiting: dict[str, list[Callable[[], None]]] = {}
_lock = threading.Lock()


def after_import(module: str, step: Callable[[], None]) -> None:
    """Run `step()` once `module` has been imported: now, or when its code has run."""
    with _lock:
        if module not in sys.modules:
            _waiting.setdefault(module, []).append(step)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    step()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a watched module as the finders after it do, with a loader that runs its steps
    after the module's code; finds nothing else (the next finder does). It leaves
    sys.meta_path once nothing is watched."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec  # (not found: the import fails as it would; the steps keep waiting)
        with _lock:
            steps = _waiting.pop(fullname, [])
            if not _waiting and self in sys.meta_path:
                sys.meta_path.remove(self)  # (importlib stops at the spec returned here)
        spec.loader = _ThenLoader(spec.loader, steps)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, steps: list[Callable[[], None]]):
        self._loader = loader
        self._steps = steps

    def __getattr__(self, name):  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for step in self._steps:
            step()
