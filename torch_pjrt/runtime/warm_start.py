"""What a process learns from the ones before it, beside their programs: a warm start.

`traced` (next to the compile cache's entries): digests of op signatures that traced
without error, one a line, followed by ` c` where the op's program checks its data (an
index in range, a target class: fused eager must keep such an op when nothing reads its
result, and a warm process, which does not trace, learns it here). Fused eager traces a
new signature where the op is recorded (so that its errors are the op's); a warm process
skips what an earlier one traced cleanly. Appended by every process; a line that is not
a digest (a torn write, a bad block) makes the note damaged: it is rewritten with its good
lines, with one warning.

`layouts` (beside it): what the meta kernel said of an op signature (its outputs' shapes,
strides and dtypes: eager/meta_record.py encodes it), one `digest json` a line. A warm
process takes a signature's entry from it instead of running PyTorch's meta kernel and
the CPU's checks again, which cost milliseconds an op on a first call (Python
decompositions, their imports). Written only after both passed, so it stands for the
same checks an op cache hit in one process stands for.

`host` (beside them): how an op signature runs on the host where a graph runs op by op
(eager/host_ops.py): its lowering as a host program (pickled, base64), or `-` where it is
not exact. A warm process takes it from here instead of tracing the lowering again (1 ms
an op: a warm HF Llama generate planned 481 of them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

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


def _read_lines(name: str, what: str, counter: str, line: re.Pattern, lines_are: str
                ) -> list[bytes]:
    """The note's lines that match `line`; one that does not (a torn write, a bad block)
    makes the note damaged: rewritten with its good lines, with one warning."""
    path = _file(name)
    data = cache_files.read(path, compile_cache.root(), what, counter)
    if data is None:
        return []
    # after the last newline: nothing, or a line another process writes now
    data = data[:data.rfind(b"\n") + 1]
    lines = data.split(b"\n")
    lines.pop()
    # One pass over the whole note first (a note near its cap holds 100,000 lines: matched
    # line by line, 0.35 s of a warm process's start); line by line only where it fails.
    if re.fullmatch(b"(?:" + line.pattern + b"\n)*", data) is not None:
        return lines
    good = [text for text in lines if line.fullmatch(text)]
    bad = next(text for text in lines if not line.fullmatch(text))
    cache_files.damaged(path, what, counter,
                        f"{len(lines) - len(good)} of {len(lines)} lines are not "
                        f"{lines_are}, e.g. {bad[:80]!r}", keep=True)
    kept = sorted(set(good))
    cache_files.replace(path, compile_cache.root(), b"".join(k + b"\n" for k in kept))
    return good


def _read_note() -> dict[str, bool]:
    lines = _read_lines(_TRACED_FILE, "note of traced ops", "traced_note", _LINE, "digests")
    # (a digest noted twice checks data where either line says so)
    found = {text[:64].decode(): False for text in lines if len(text) == 64}
    found.update((text[:64].decode(), True) for text in lines if len(text) > 64)
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


def _merged(data: bytes, name: str, line: re.Pattern, have: Callable[[], dict],
            max_bytes: int) -> int:
    """Append another cache's lines of a note (a shipped cache: runtime/cache_bundle.py)
    whose digests this one lacks; lines not well formed are left out. Returns how many."""
    known = have() if compile_cache.enabled() else {}
    new = [text for text in data.split(b"\n") if line.fullmatch(text)
           and text[:64].decode() not in known]
    if new and compile_cache.enabled():
        cache_files.append(_file(name), compile_cache.root(),
                           b"".join(text + b"\n" for text in new), max_bytes)
    return len(new)


def merge(data: bytes) -> int:
    """The traced-ops note of a shipped cache, added to this one's."""
    global _traced
    n = _merged(data, _TRACED_FILE, _LINE, _read_note, _TRACED_MAX_BYTES)
    if n:
        _traced = None  # read again at the next lookup
    return n


def forget() -> None:
    """The cache was cleared: drop what was learnt from it."""
    global _traced
    cache_files.remove(_file(_TRACED_FILE))
    _traced = None
    for records in (LAYOUTS, HOST):
        records.forget()


class Records:
    """A note of one text per op signature (`digest text` a line, ASCII): appended by
    every process, read once, the first line of a digest winning."""

    def __init__(self, file: str, what: str, counter: str, text: bytes, max_bytes: int):
        self.file = file
        self.path = "xla/" + file  # under the cache root (shipped caches carry it)
        self.what = what
        self.counter = counter
        self.line = re.compile(rb"([0-9a-f]{64}) (" + text + rb")")
        self.max_bytes = max_bytes
        self.loaded: dict[str, bytes] | None = None

    def _read(self) -> dict[str, bytes]:
        lines = _read_lines(self.file, self.what, self.counter, self.line,
                            "digests with their records")
        return {text[:64].decode(): text[65:] for text in reversed(lines)}

    def get(self, name: str) -> bytes | None:
        """The text an earlier process (or this one) noted for op signature `name`."""
        if self.loaded is None:
            self.loaded = self._read() if compile_cache.enabled() else {}
        return self.loaded.get(name)

    def note(self, name: str, text: bytes) -> None:
        """Record `text` for `name` (ASCII, one line), unless a record is there."""
        if self.get(name) is not None:
            return
        self.loaded[name] = text
        if compile_cache.enabled():
            cache_files.append(_file(self.file), compile_cache.root(),
                               name.encode() + b" " + text + b"\n", self.max_bytes)

    def merge(self, data: bytes) -> int:
        """The note of a shipped cache, added to this one's."""
        n = _merged(data, self.file, self.line, self._read, self.max_bytes)
        if n:
            self.loaded = None
        return n

    def forget(self) -> None:
        cache_files.remove(_file(self.file))
        self.loaded = None


# What the meta kernel said of an op signature (eager/meta_record.py's JSON)
LAYOUTS = Records("layouts", "note of op layouts", "layout_note", rb"\[[ -~]*\]", 16 << 20)
# How it runs on the host: a host program, base64 (eager/host_ops.py), or - (not exact)
HOST = Records("host", "note of host programs", "host_note", rb"-|[A-Za-z0-9+/=]+", 32 << 20)
