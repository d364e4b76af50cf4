"""Counters for what the backend did: compiles, cache hits, fallbacks, transfers."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

# A plain dict: the eager hit path bumps "cache_hits" with `d[k] += 1`, which Python
# specializes for exact dicts only (about 40 ns, against 105 ns for a Counter).
_HOT = ("cache_hits",)
_counters: dict[str, int] = dict.fromkeys(_HOT, 0)
_fallbacks: Counter = Counter()
_compile_seconds: list[float] = [0.0]
_seconds: dict[str, float] = {}  # durations by name (xla_compile_seconds, ...)
_lock = threading.Lock()  # compile threads count too (runtime/compile_pool.py)


def count(name: str, n: int = 1) -> None:
    with _lock:
        _counters[name] = _counters.get(name, 0) + n


def value(name: str) -> int:
    """One counter's current value (cheaper than metrics() on a hot path)."""
    return _counters.get(name, 0)


def count_fallback(op_name: str) -> None:
    _fallbacks[op_name] += 1


def add_compile_time(seconds: float) -> None:
    with _lock:
        _compile_seconds[0] += seconds


def add_seconds(name: str, seconds: float) -> None:
    """Add to a duration counter (metrics() shows it under `name`, in seconds)."""
    with _lock:
        _seconds[name] = _seconds.get(name, 0.0) + seconds


def metrics() -> dict[str, Any]:
    """A snapshot of every counter (see docs for their meaning)."""
    out: dict[str, Any] = {k: v for k, v in _counters.items() if v}
    out["compile_seconds"] = round(_compile_seconds[0], 6)
    out.update({k: round(v, 6) for k, v in _seconds.items()})
    out["cpu_fallbacks"] = dict(_fallbacks)
    return out


_on_reset: list = []  # what else forgets its records with the counters (runtime.watch)


def on_reset(fn) -> None:
    _on_reset.append(fn)


def reset() -> None:
    for fn in _on_reset:
        fn()
    _counters.clear()
    _counters.update(dict.fromkeys(_HOT, 0))
    _fallbacks.clear()
    _compile_seconds[0] = 0.0
    _seconds.clear()
