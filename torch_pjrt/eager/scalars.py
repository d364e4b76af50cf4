"""Run-time Python numbers as device arrays, cached per value and device."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import jax

from ..runtime import client

_scalars: dict[tuple, Any] = {}
_PY_SCALARS = (float, int, bool, complex)
INT64_MAX = 2 ** 63 - 1  # past it, an int run-time value is np.uint64 (eager/call_key.py)

# Where a number's conversion to some dtype starts or stops overflowing (c10::overflows: below
# the type's lowest or above its largest finite value): the integer types' bounds and the
# floating types' largest finite values. PyTorch checks the numbers an op converts (int8's
# fill_(1000) and add_(..., alpha=3000) raise, fill_(100) does not), and a signature's first
# call is checked for the later calls that reuse its entry: so the key holds the range a
# run-time number falls in (range_of), and the check runs again for a number of another
# range. The native key builder (runtime/native/op_kernel.cpp, number_range) has the twin.
_F16_MAX, _BF16_MAX, _F32_MAX = 65504.0, 3.3895313892515355e38, 3.4028234663852886e38
RANGE_BOUNDS = sorted({-_F32_MAX, -_BF16_MAX, -2 ** 63, -2 ** 31, -_F16_MAX, -2 ** 15, -2 ** 7,
                       0, 2 ** 7 - 1, 2 ** 8 - 1, 2 ** 15 - 1, _F16_MAX, 2 ** 16 - 1, 2 ** 31 - 1,
                       2 ** 32 - 1, 2 ** 63 - 1, 2 ** 64 - 1, _BF16_MAX, _F32_MAX})


def range_of(v) -> int:
    """The range of RANGE_BOUNDS a run-time int or float falls in (a bound is a range of its
    own; NaN and the infinities are ranges too); 0 for the other numbers."""
    t = type(v)
    if t is float:
        if v != v:
            return -1
        if v in (float("inf"), float("-inf")):
            return -2 if v > 0 else -3
    elif t is not int:
        return 0
    i = bisect_left(RANGE_BOUNDS, v)
    return 2 * i + (i < len(RANGE_BOUNDS) and RANGE_BOUNDS[i] == v)


def device_scalar(v, device: int):
    """A run-time Python number as a (weakly typed) device array, cached: passing the
    number itself makes every launch convert and copy it to the device. `device_put` of
    the number gives the array `jnp.asarray` would (dtype, weak type, value) without
    jnp's conversion program: that one cost a process an MLIR context and two compiles
    (0.15 s) at its first run-time number, a warm process's first call included."""
    if type(v) not in _PY_SCALARS:
        return v
    key = (type(v), v, device) if v == v and v != 0 else (type(v), repr(v), device)
    arr = _scalars.get(key)
    if arr is None:
        if len(_scalars) >= 4096:
            _scalars.clear()
        arr = _scalars[key] = jax.device_put(v, client.device(device))
    return arr
