"""Compiles off the user's thread: XLA releases the GIL while it compiles, so the programs a
flush needs now compile side by side on every core, and a program nobody waits for compiles
in the background and is taken into use, on the user's thread, once it is ready."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _env, counters, logs


def threads() -> int:
    """Programs compiled at once (TORCH_PJRT_COMPILE_THREADS; empty: one per core)."""
    value = _env.get("TORCH_PJRT_COMPILE_THREADS").strip()
    return max(1, int(value) if value else (os.cpu_count() or 1))


# ------------------------------------------------------------------ now, in parallel
_pool: ThreadPoolExecutor | None = None


def parallel(works: list[Callable[[], Any]]) -> list[Any]:
    """Each work's result, in order, the works run side by side: the caller's thread and
    the pool's each take the next work not taken yet until none is left. The first error
    raises, once every work has finished."""
    global _in_parallel
    if len(works) <= 1 or threads() == 1:
        return [work() for work in works]
    with _cond:
        _in_parallel += 1
    try:
        return _parallel(works)
    finally:
        with _cond:
            _in_parallel -= 1


def _parallel(works: list[Callable[[], Any]]) -> list[Any]:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(threads() - 1, thread_name_prefix="pjrt-compile")
    results: list[Any] = [None] * len(works)
    errors: list[Exception | None] = [None] * len(works)
    order = iter(range(len(works)))
    finished = 0
    state = threading.Condition()

    def drain() -> None:
        nonlocal finished
        # (a caller that ran only the first work and waited for the rest left one of two
        # cores idle: a cold generate's op programs compiled one at a time)
        while True:
            with state:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = works[i]()
            except Exception as e:  # noqa: BLE001 - raised below, after the others finished
                errors[i] = e
            with state:
                finished += 1
                state.notify_all()

    for _ in range(min(threads() - 1, len(works) - 1)):
        _pool.submit(drain)
    drain()
    with state:  # (not the helpers themselves: one still queued finds nothing left)
        state.wait_for(lambda: finished == len(works))
    error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise error
    return results


# ------------------------------------------------------------------ in the background
class Job:
    """A background compile: `work()` runs on a compile thread and must touch no state the
    user's thread changes (compile_cache.obtain is such a work); `done(result, error)` runs
    on the user's thread once it has finished (at its next poll() or wait())."""

    __slots__ = ("work", "done", "result", "error", "seconds", "what", "started", "finished")

    def __init__(self, work: Callable[[], Any], done: Callable[[Any, Exception | None], None],
                 what: str):
        self.work = work
        self.done = done
        self.what = what
        self.result = None
        self.error: Exception | None = None
        self.seconds = 0.0
        self.started: float | None = None  # time.perf_counter() when a thread took it
        self.finished = False


_cond = threading.Condition()
_queued: collections.deque[Job] = collections.deque()
_running = 0  # jobs a compile thread is working on
_in_parallel = 0  # parallel() calls in flight
_finished: list[Job] = []  # jobs whose done() has not run yet
_workers: list[threading.Thread] = []
_stopping = False


def submit(job: Job) -> None:
    """Queue `job` for a compile thread (started on first use: one fewer than there are
    cores, at least one, so that the user's thread keeps a core)."""
    with _cond:
        if _stopping:
            return
        _queued.append(job)
        if len(_workers) < max(1, threads() - 1) and len(_workers) < len(_queued) + _running:
            t = threading.Thread(target=_work, name=f"pjrt-compile-bg-{len(_workers)}",
                                 daemon=True)
            _workers.append(t)
            t.start()
        _cond.notify()
    counters.count("background_compiles_queued")


def _work() -> None:
    global _running
    while True:
        with _cond:
            while not _queued and not _stopping:
                _cond.wait()
            if _stopping:
                return
            job = _queued.popleft()
            _running += 1
            start = job.started = time.perf_counter()
        try:
            job.result = job.work()
        except Exception as e:  # noqa: BLE001 - handed to done() on the user's thread
            job.error = e
        job.seconds = time.perf_counter() - start
        with _cond:
            _running -= 1
            job.finished = True
            _finished.append(job)
            _cond.notify_all()


def pending() -> int:
    """Background compiles queued, running, or finished and not yet taken into use."""
    with _cond:
        return len(_queued) + _running + len(_finished)


def idle() -> bool:
    """No background compile queued or running, and none inside parallel()."""
    with _cond:
        return not _queued and not _running and not _in_parallel


def poll() -> int:
    """Take the finished background compiles into use (their done() on this thread)."""
    if not _finished:
        return 0
    with _cond:
        jobs = list(_finished)
        _finished.clear()
    for job in jobs:
        job.done(job.result, job.error)
    return len(jobs)


def wait(timeout: float | None = None) -> bool:
    """Wait until every queued background compile has finished (poll() then takes them
    into use); False if `timeout` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cond:
        while _queued or _running:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            _cond.wait(left)
        return not _queued and not _running


def wait_for(job: Job) -> None:
    """Wait until `job` has run on a compile thread (poll() then takes it into use); at
    once where it will not run (dropped by cancel() or at exit)."""
    with _cond:
        while not job.finished and (job.started is not None or job in _queued):
            _cond.wait()


class Cancelled(Exception):
    """What done() gets for a job dropped before it ran (cancel())."""


def cancel() -> int:
    """Drop the queued background compiles (their done() gets Cancelled, on this thread)
    and wait for the running ones; returns how many were dropped. Tests call this between
    tests, so that no compile of one lands in another's counters."""
    with _cond:
        dropped = list(_queued)
        _queued.clear()
        while _running:
            _cond.wait()
    for job in dropped:
        job.done(None, Cancelled())
    return len(dropped)


def _stop() -> None:
    """At exit: queued compiles are dropped and the running ones waited for (XLA aborts
    the process when it exits in the middle of a compile on another thread)."""
    global _stopping
    with _cond:
        _stopping = True
        dropped = len(_queued)
        _queued.clear()
        _cond.notify_all()
        busy = _running
    if busy:
        start = time.perf_counter()
        for t in _workers:
            t.join()
        logs.compiles.info("waited %.2f s at exit for %d background compile(s); dropped %d",
                           time.perf_counter() - start, busy, dropped)


# Before the interpreter joins its threads and runs atexit handlers (JAX's among them).
_at_exit = getattr(threading, "_register_atexit", None)
if _at_exit is not None:
    _at_exit(_stop)
else:  # pragma: no cover - an interpreter without it: atexit, which runs later
    import atexit

    atexit.register(_stop)
