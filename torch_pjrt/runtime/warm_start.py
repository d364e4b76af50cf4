"""What a process learns from the ones before it, beside their programs: a warm start.

`traced` (next to the compile cache's entries): digests of op signatures that traced
without error, one a line. Fused eager traces a new signature where the op is recorded
(so that its errors are the op's); a warm process skips what an earlier one traced
cleanly. Appended by every process; a line that is not a digest (a torn write, a bad
block) makes the note damaged: it is rewritten with its good lines, with one warning.
"""

from __future__ import annotations

import os
import re

from . import cache_files, compile_cache

_TRACED_FILE = "traced"
_TRACED_MAX_BYTES = 8 << 20  # past this the file starts over (only re-tracing is lost)
_DIGEST = re.compile(rb"[0-9a-f]{64}")  # compile_cache.digest()

_traced: set[str] | None = None


def _file(name: str) -> str:
    return os.path.join(compile_cache.directory(), name)


def traced_before(name: str) -> bool:
    """Whether the op program `name` has traced without error, in this process or (with
    the disk cache on) in an earlier one with the same sources and versions."""
    global _traced
    if _traced is None:
        _traced = _read_note() if compile_cache.enabled() else set()
    return name in _traced


def _read_note() -> set[str]:
    path = _file(_TRACED_FILE)
    data = cache_files.read(path, compile_cache.root(), "note of traced ops", "traced_note")
    if data is None:
        return set()
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing, or a line another process writes now
    good = [line for line in lines if _DIGEST.fullmatch(line)]
    if len(good) < len(lines):
        bad = next(line for line in lines if not _DIGEST.fullmatch(line))
        cache_files.damaged(path, "note of traced ops", "traced_note",
                            f"{len(lines) - len(good)} of {len(lines)} lines are not digests, "
                            f"e.g. {bad[:80]!r}", keep=True)
        names = sorted(set(good))
        cache_files.replace(path, compile_cache.root(), b"".join(n + b"\n" for n in names))
    return {line.decode() for line in good}


def note_traced(name: str) -> None:
    """Record that `name` traced without error (appended: several processes may write)."""
    if traced_before(name):
        return
    _traced.add(name)
    if not compile_cache.enabled():
        return
    cache_files.append(_file(_TRACED_FILE), compile_cache.root(), (name + "\n").encode(),
                       _TRACED_MAX_BYTES)


def forget() -> None:
    """The cache was cleared: drop what was learnt from it."""
    global _traced
    cache_files.remove(_file(_TRACED_FILE))
    _traced = None
