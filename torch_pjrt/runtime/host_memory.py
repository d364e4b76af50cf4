"""Keep freed host memory for reuse when the device is the host CPU.

On XLA:CPU every program run allocates its outputs and one scratch buffer for its
temporaries with the C library's malloc, and frees them when they die. glibc serves
large blocks (above its mmap threshold, and any block too big for a thread's arena)
with a fresh mmap and returns them with munmap, so each run of a training step
touches its scratch memory for the first time again: a fused GPT step of
bench/train.py took ~30,000 page faults (its 110 MB scratch buffer) per step. Told to
keep one arena, never to mmap and not to trim, glibc hands the same pages back run
after run, as a caching allocator would (page faults per GPT step: fused 29,800 -> 0,
compiled 21,100 -> ~0, strict 9,800 -> ~0; resident memory no higher).

The cost: the process keeps its peak host memory, and blocks freed out of order can
fragment the heap. A worst case measured: two 48 MB outputs alternating (each run's
output replacing the last) settle at ~400 MB more resident memory than with mmap.
TORCH_PJRT_HOST_MALLOC=0 leaves malloc as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from .. import _env

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

tuned = False


def tune() -> bool:
    """Set glibc's malloc up to reuse freed blocks (Linux with glibc only); whether it did."""
    global tuned
    if tuned or not _env.flag("TORCH_PJRT_HOST_MALLOC") or not sys.platform.startswith("linux"):
        return tuned
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 1 << 30),
                (_M_TOP_PAD, 64 << 20))
    tuned = all(mallopt(option, value) == 1 for option, value in settings)
    return tuned
