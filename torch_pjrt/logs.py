"""The `torch_pjrt` loggers (compiles, recompiles, CPU fallbacks), so that applications route,
filter and silence what the backend reports the way they do any library's logs."""

from __future__ import annotations

import logging
import sys

from . import _env

INFO = logging.INFO  # the level of every record here

logger = logging.getLogger("torch_pjrt")
compiles = logging.getLogger("torch_pjrt.compile")  # each program compiled or loaded from disk
recompiles = logging.getLogger("torch_pjrt.recompile")  # the same code compiled for new inputs
fallbacks = logging.getLogger("torch_pjrt.fallback")  # ops run on the CPU (no lowering)

# A library adds no handler of its own (the application's configuration decides), except
# this one: it keeps Python's last-resort handler from printing our records while the
# application has configured nothing.
logger.addHandler(logging.NullHandler())

_verbose_handler: logging.Handler | None = None


def configure() -> None:
    """TORCH_PJRT_VERBOSE=1, a shortcut: the torch_pjrt logger at INFO, printing to stderr
    (`torch_pjrt: ...`). The same as the application calling
    `logging.getLogger("torch_pjrt").setLevel(logging.INFO)` with a handler of its own."""
    global _verbose_handler
    if not _env.flag("TORCH_PJRT_VERBOSE"):
        return
    logger.setLevel(logging.INFO)
    if _verbose_handler is None:
        _verbose_handler = logging.StreamHandler(sys.stderr)
        _verbose_handler.setFormatter(logging.Formatter("torch_pjrt: %(message)s"))
        logger.addHandler(_verbose_handler)


configure()
