"""The eager execution mode: strict, fused or debug.

strict: each op is one cached XLA executable, launched asynchronously.
fused:  ops are recorded into a pending graph, compiled (cached by structure)
        and run when a value is needed.
debug:  each op runs synchronously and is checked where it happens.
"""

from __future__ import annotations

from .. import _env

MODES = ("strict", "fused", "debug")

# Read on every op: plain module booleans are the cheapest check.
fused = False
debug = False
_current = "strict"


def get() -> str:
    """The eager mode; before PJRT starts, the one it will start in."""
    if not _explicit and not _from_env:
        return _env_mode()
    return _current


def _apply(mode: str) -> None:
    global fused, debug, _current
    if mode not in MODES:
        raise ValueError(f"torch_pjrt: unknown eager mode {mode!r}; accepted: {', '.join(MODES)}")
    if _current == "fused" and mode != "fused":
        from . import graph

        graph.flush("mode change")
    _current = mode
    fused = mode == "fused"
    debug = mode == "debug"


class set_eager_mode:  # noqa: N801 - a function that is also a context manager
    """Set the eager mode; as a context manager, restore the previous one on exit.

    >>> torch_pjrt.set_eager_mode("fused")
    >>> with torch_pjrt.set_eager_mode("debug"):
    ...     y = model(x)
    """

    def __init__(self, mode: str):
        global _explicit
        self.previous = get()  # (before PJRT starts: the mode it would start in)
        _explicit = True
        _apply(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _apply(self.previous)
        return False


_explicit = False  # set_eager_mode was called: the environment no longer decides
_from_env = False  # init_from_env ran (PJRT started)


def _env_mode() -> str:
    return _env.get("TORCH_PJRT_EAGER_MODE").strip().lower() or "fused"


def init_from_env() -> None:
    global _from_env
    _from_env = True
    if not _explicit:
        _apply(_env_mode())
