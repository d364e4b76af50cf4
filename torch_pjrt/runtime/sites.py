"""The user's line of code behind a sync, a compile or a fallback: what the report names.

The first frame of the calling thread outside torch-pjrt, PyTorch, JAX and the Python
standard library. Taken only where something rare happens (a synchronization, a
compile, a CPU fallback; each recorded op only while a profile or a dump asks for it):
walking the stack costs about a microsecond.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import threading


def _library_dirs() -> tuple[str, ...]:
    import jax
    import numpy
    import torch

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # torch_pjrt
    dirs += [os.path.dirname(os.path.abspath(m.__file__)) for m in (torch, jax, numpy)]
    dirs += [sysconfig.get_paths()["stdlib"]]
    return tuple(d + os.sep for d in dirs)


_skip: dict = {}  # code object -> whether its frames are library code
_dirs: tuple[str, ...] | None = None


def user_site() -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of user code, or None. On a thread
    without user code (the autograd engine's, running a backward pass for the main
    thread), the main thread's."""
    site = _first_user_frame(sys._getframe(1))
    if site is None and threading.current_thread() is not threading.main_thread():
        site = _first_user_frame(sys._current_frames().get(threading.main_thread().ident))
    return site


def _first_user_frame(frame) -> tuple[str, int, str] | None:
    global _dirs
    if _dirs is None:
        _dirs = _library_dirs()
    skip = _skip
    while frame is not None:
        code = frame.f_code
        library = skip.get(code)
        if library is None:
            name = code.co_filename
            library = skip[code] = name.startswith(_dirs) or name.startswith("<frozen")
        if not library:
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


def from_traceback(text: str | None) -> tuple[str, int, str] | None:
    """The innermost frame of a formatted traceback (an FX node's `stack_trace`)."""
    frames = list(_FRAME.finditer(text or ""))
    if not frames:
        return None
    last = frames[-1]
    return last["path"], int(last["line"]), last["function"]


def text(site: tuple[str, int, str] | None, full: bool = False) -> str:
    """'train.py:42 (main)', or the whole path with `full`; '(no user code)' for None."""
    if site is None:
        return "(no user code)"
    path, line, function = site
    shown = path if full else _short(path)
    return f"{shown}:{line} ({function})" if function != "<module>" else f"{shown}:{line}"


def _short(path: str) -> str:
    """The path relative to the working directory when it is under it, else its name."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return os.path.basename(path)
    return rel if not rel.startswith("..") else os.path.basename(path)
