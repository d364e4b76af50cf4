"""Run-time Python numbers as device arrays, cached per value and device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..runtime import client

_scalars: dict[tuple, Any] = {}
_PY_SCALARS = (float, int, bool, complex)
INT64_MAX = 2 ** 63 - 1  # past it, an int run-time value is np.uint64 (eager/call_key.py)


def device_scalar(v, device: int):
    """A run-time Python number as a (weakly typed) device array, cached: passing the
    number itself makes every launch convert and copy it to the device."""
    if type(v) not in _PY_SCALARS:
        return v
    key = (type(v), v, device) if v == v and v != 0 else (type(v), repr(v), device)
    arr = _scalars.get(key)
    if arr is None:
        if len(_scalars) >= 4096:
            _scalars.clear()
        arr = _scalars[key] = jax.device_put(jnp.asarray(v), client.device(device))
    return arr
