"""What a process learns from the ones before it, beside their programs: a warm start.

`traced` (next to the compile cache's entries): digests of op signatures that traced
without error, one a line, followed by ` c` where the op's program checks its data (an
index in range, a target class: fused eager must keep such an op when nothing reads its
result, and a warm process, which does not trace, learns it here). Fused eager traces a
new signature where the op is recorded (so that its errors are the op's); a warm process
skips what an earlier one traced cleanly. Appended by every process; a line that is not
a digest (a torn write, a bad block) makes the note damaged: it is rewritten with its good
lines, with one warning.
"""

from __future__ import annotations

import os
import re

from . import cache_files, compile_cache

_TRACED_FILE = "traced"
NOTE = "xla/" + _TRACED_FILE  # its path under the cache root (shipped caches carry it)
_TRACED_MAX_BYTES = 8 << 20  # past this the file starts over (only re-tracing is lost)
_LINE = re.compile(rb"([0-9a-f]{64})( c)?")  # compile_cache.digest(), checks data

_traced: dict[str, bool] | None = None  # digest -> whether its program checks data


def _file(name: str) -> str:
    return os.path.join(compile_cache.directory(), name)


def traced_before(name: str) -> bool:
    """Whether the op program `name` has traced without error, in this process or (with
    the disk cache on) in an earlier one with the same sources and versions."""
    global _traced
    if _traced is None:
        _traced = _read_note() if compile_cache.enabled() else {}
    return name in _traced


def checks_data(name: str) -> bool:
    """Whether the op program `name`, traced before, checks its data on the device."""
    return traced_before(name) and _traced[name]


def _read_note() -> dict[str, bool]:
    path = _file(_TRACED_FILE)
    data = cache_files.read(path, compile_cache.root(), "note of traced ops", "traced_note")
    if data is None:
        return {}
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing, or a line another process writes now
    good = [line for line in lines if _LINE.fullmatch(line)]
    if len(good) < len(lines):
        bad = next(line for line in lines if not _LINE.fullmatch(line))
        cache_files.damaged(path, "note of traced ops", "traced_note",
                            f"{len(lines) - len(good)} of {len(lines)} lines are not digests, "
                            f"e.g. {bad[:80]!r}", keep=True)
        names = sorted(set(good))
        cache_files.replace(path, compile_cache.root(), b"".join(n + b"\n" for n in names))
    found: dict[str, bool] = {}
    for line in good:
        digest, checked = _LINE.fullmatch(line).groups()
        found[digest.decode()] = found.get(digest.decode(), False) or checked is not None
    return found


def note_traced(name: str, checks_data: bool) -> None:
    """Record that `name` traced without error, and whether its program checks data
    (appended: several processes may write)."""
    if traced_before(name):
        return
    _traced[name] = checks_data
    if not compile_cache.enabled():
        return
    line = name + (" c" if checks_data else "") + "\n"
    cache_files.append(_file(_TRACED_FILE), compile_cache.root(), line.encode(),
                       _TRACED_MAX_BYTES)


def merge(data: bytes) -> int:
    """Add the digests of another cache's note (a shipped cache: runtime/cache_bundle.py)
    that this one lacks; lines that are not digests are left out. Returns how many."""
    global _traced
    have = _read_note() if compile_cache.enabled() else {}
    new = [line for line in data.split(b"\n") if _LINE.fullmatch(line)
           and line.split(b" ")[0].decode() not in have]
    if new and compile_cache.enabled():
        cache_files.append(_file(_TRACED_FILE), compile_cache.root(),
                           b"".join(line + b"\n" for line in new), _TRACED_MAX_BYTES)
        _traced = None  # read again at the next lookup
    return len(new)


def forget() -> None:
    """The cache was cleared: drop what was learnt from it."""
    global _traced
    cache_files.remove(_file(_TRACED_FILE))
    _traced = None
