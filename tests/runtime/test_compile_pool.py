"""runtime/compile_pool.py: programs a flush needs now, built side by side on every core."""

import threading
import time

import pytest

from torch_pjrt.runtime import compile_pool


def _works(n: int, ran: list, fail: set = frozenset()):
    def work(i):
        def run():
            ran.append((i, threading.get_ident()))
            time.sleep(0.02)  # (a compile: the GIL let go)
            if i in fail:
                raise ValueError(f"work {i}")
            return i * i
        return run
    return [work(i) for i in range(n)]


def test_the_callers_thread_and_the_pools_share_the_works(monkeypatch):
    monkeypatch.setattr(compile_pool, "threads", lambda: 2)
    ran = []
    start = time.perf_counter()
    assert compile_pool.parallel(_works(10, ran)) == [i * i for i in range(10)]
    took = time.perf_counter() - start
    assert sorted(i for i, _ in ran) == list(range(10))  # each work once
    mine = sum(t == threading.get_ident() for _, t in ran)
    # (before, the caller ran the first work and waited for the pool's one thread to run
    # the other nine: one core of two idle)
    assert 2 <= mine <= 8, mine
    assert took < 9 * 0.02, took


def test_the_first_error_raises_once_every_work_has_run(monkeypatch):
    monkeypatch.setattr(compile_pool, "threads", lambda: 2)
    ran = []
    with pytest.raises(ValueError, match="work 3"):
        compile_pool.parallel(_works(8, ran, fail={3, 6}))
    assert sorted(i for i, _ in ran) == list(range(8))
    assert compile_pool.idle()


def test_one_thread_runs_the_works_in_order_on_the_callers(monkeypatch):
    monkeypatch.setattr(compile_pool, "threads", lambda: 1)
    ran = []
    assert compile_pool.parallel(_works(4, ran)) == [0, 1, 4, 9]
    assert ran == [(i, threading.get_ident()) for i in range(4)]


def test_a_work_may_build_side_by_side_itself(monkeypatch):
    """A work that calls parallel() on the pool's thread finishes: it waits for its works,
    never for a helper queued behind itself (the pool's only thread, on two cores)."""
    monkeypatch.setattr(compile_pool, "threads", lambda: 2)
    where = []

    def work():
        if threading.current_thread().name.startswith("pjrt-compile"):
            where.append("pool")
            return sum(compile_pool.parallel(_works(3, [])))
        time.sleep(0.3)  # (the caller's: the pool's thread takes the other)
        return 5

    done = []
    t = threading.Thread(target=lambda: done.append(compile_pool.parallel([work, work])),
                         daemon=True)
    t.start()
    t.join(30)
    assert done == [[5, 5]], "parallel() inside a work on the pool's thread deadlocked"
    assert where == ["pool"]
