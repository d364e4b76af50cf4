"""What a process learns from the ones before it, beside their programs: a warm start.

`traced` (next to the compile cache's entries): digests of op signatures that traced
without error. Fused eager traces a new signature where the op is recorded (so that its
errors are the op's); a warm process skips what an earlier one traced cleanly. Appended
by every process.
"""

from __future__ import annotations

import os

from . import compile_cache

_TRACED_FILE = "traced"
_TRACED_MAX_BYTES = 8 << 20  # past this the file starts over (only re-tracing is lost)

_traced: set[str] | None = None


def _file(name: str) -> str:
    return os.path.join(compile_cache.directory(), name)


def traced_before(name: str) -> bool:
    """Whether the op program `name` has traced without error, in this process or (with
    the disk cache on) in an earlier one with the same sources and versions."""
    global _traced
    if _traced is None:
        _traced = set()
        if compile_cache.enabled():
            try:
                with open(_file(_TRACED_FILE)) as f:
                    _traced.update(f.read().split())
            except OSError:
                pass
    return name in _traced


def note_traced(name: str) -> None:
    """Record that `name` traced without error (appended: several processes may write)."""
    if traced_before(name):
        return
    _traced.add(name)
    if not compile_cache.enabled():
        return
    try:
        os.makedirs(compile_cache.directory(), exist_ok=True)
        fd = os.open(_file(_TRACED_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size > _TRACED_MAX_BYTES:
                os.ftruncate(fd, 0)
            os.write(fd, (name + "\n").encode())  # one short write: atomic with O_APPEND
        finally:
            os.close(fd)
    except OSError:
        pass


def forget() -> None:
    """The cache was cleared: drop what was learnt from it."""
    global _traced
    try:
        os.remove(_file(_TRACED_FILE))
    except OSError:
        pass
    _traced = None
