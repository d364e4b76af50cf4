"""What a process learns from the ones before it, beside their programs: a warm start.

Two small files next to the compile cache's entries:

- `traced`: digests of op signatures that traced without error. Fused eager traces a
  new signature where the op is recorded (so that its errors are the op's); a warm
  process skips what an earlier one traced cleanly. Appended by every process.
- `startup`: the programs the last process used first, in order. At start-up a
  background thread deserializes them while the main thread is still busy with
  Python (Dynamo tracing, building the model): XLA releases the GIL while it loads, so
  a warm start stops paying ~0.1 s per large program on its critical path. Rewritten
  by each process at exit; a name that is gone or damaged is left to load() to handle.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import threading
from typing import Any

from . import compile_cache

_TRACED_FILE = "traced"
_TRACED_MAX_BYTES = 8 << 20  # past this the file starts over (only re-tracing is lost)
_STARTUP_FILE = "startup"
_STARTUP_MAX = 256  # programs remembered (and prefetched) per process
_PREFETCH_MAX_BYTES = 256 << 20  # entry bytes prefetched at most

_traced: set[str] | None = None
_used: dict[str, int] = {}  # name -> device, in order of first use (the first _STARTUP_MAX)
_ahead: dict[str, tuple[int, concurrent.futures.Future]] = {}
_worker: threading.Thread | None = None
_stop = threading.Event()
_exit_hook = False


def _file(name: str) -> str:
    return os.path.join(compile_cache.directory(), name)


# ------------------------------------------------------------------ traced signatures
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


# ------------------------------------------------------------------ startup programs
def prefetch() -> None:
    """Start loading the programs the last process used first (called once PJRT is up)."""
    global _worker
    if _worker is not None or not compile_cache.enabled():
        return
    try:
        with open(_file(_STARTUP_FILE)) as f:
            lines = f.read().split("\n")
    except OSError:
        return
    budget = _PREFETCH_MAX_BYTES
    for line in lines[:_STARTUP_MAX]:
        name, _, device = line.partition(" ")
        try:
            budget -= os.path.getsize(compile_cache._path(name))
        except OSError:
            continue
        if budget < 0:
            break
        _ahead[name] = (int(device), concurrent.futures.Future())
    if _ahead:
        _worker = threading.Thread(target=_prefetch_all, args=(list(_ahead.items()),),
                                   name="pjrt-prefetch", daemon=True)
        _worker.start()
        _at_exit()


def _prefetch_all(items: list) -> None:
    for name, (device, future) in items:
        if _stop.is_set():
            return
        if future.set_running_or_notify_cancel():
            future.set_result(compile_cache.read(name, device))


def take(name: str, device: int) -> tuple[str, Any] | None:
    """The prefetched outcome of compile_cache.read(name, device): waits when the
    background thread is reading it now; None when it was not prefetched or not started
    yet (then the caller reads it itself, at once)."""
    found = _ahead.pop(name, None)
    if found is None or found[0] != device:
        return None
    future = found[1]
    if future.cancel():  # still queued
        return None
    return future.result()


def note_used(name: str, device: int) -> None:
    """`name` was needed by this process: the next one prefetches it."""
    if name in _used or len(_used) >= _STARTUP_MAX:
        return
    _used[name] = device
    _at_exit()


def _at_exit() -> None:
    global _exit_hook
    if not _exit_hook:
        atexit.register(_finish)
        _exit_hook = True


def _finish() -> None:
    """Stop prefetching (joined, so that no load runs while the interpreter goes down);
    write this process's startup list."""
    _stop.set()
    for _, future in list(_ahead.values()):
        future.cancel()
    if _worker is not None:
        _worker.join(timeout=5)
    _ahead.clear()  # unclaimed programs go while PJRT is up (later, freeing them crashed)
    if not _used or not compile_cache.enabled():
        return
    text = "\n".join(f"{name} {device}" for name, device in _used.items())
    path = _file(_STARTUP_FILE)
    try:
        os.makedirs(compile_cache.directory(), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def forget() -> None:
    """The cache was cleared: drop what was learnt from it."""
    global _traced
    for name in (_TRACED_FILE, _STARTUP_FILE):
        try:
            os.remove(_file(name))
        except OSError:
            pass
    _traced = None
    _used.clear()
