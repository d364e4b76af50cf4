"""Run-time Python numbers as device arrays (eager/scalars.py): the array JAX's own
conversion would give, made without compiling a program."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_pjrt
from torch_pjrt.eager import scalars

VALUES = [1.5, -0.0, math.inf, -math.inf, math.nan, 1e300, 3, 0, -2**63, 2**63 - 1,
          True, False, 1 + 2j, complex(0.0, -0.0)]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_device_scalar_is_what_jnp_asarray_gives(value):
    torch_pjrt.ensure_initialized()
    scalars._scalars.clear()
    got = scalars.device_scalar(value, 0)
    want = jnp.asarray(value)
    assert (got.dtype, got.weak_type, got.shape) == (want.dtype, want.weak_type, want.shape)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()  # -0.0 and NaN bits too
    assert scalars.device_scalar(value, 0) is got  # cached


def test_device_scalar_compiles_nothing():
    torch_pjrt.ensure_initialized()
    scalars._scalars.clear()
    compiles = []

    def listener(event, duration, **kwargs):
        if "compil" in event:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for v in (0.25, 7, True, 2 - 1j):
            scalars.device_scalar(v, 0)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


def test_numbers_in_ops_match_the_cpu():
    x = torch.arange(6.0).reshape(2, 3)
    for mode in ("strict", "fused"):
        with torch_pjrt.set_eager_mode(mode):
            got = (x.to("pjrt").add(2.5, alpha=-3).mul(7).add(True).clamp(-1e30, 1e30)).cpu()
        want = x.add(2.5, alpha=-3).mul(7).add(True).clamp(-1e30, 1e30)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_fused_program_takes_numbers_as_cached_device_arrays(monkeypatch):
    """Passed as Python numbers, every run of a fused graph's program would copy each one
    to the device (schedule.Piece.run converts them once, cached)."""
    from torch_pjrt.eager import program, tiers

    monkeypatch.setattr(tiers, "enabled", False)  # the program from the first run on
    seen = []
    call = program.Program.__call__

    def recording(self, *args):
        seen.append(args)
        return call(self, *args)

    monkeypatch.setattr(program.Program, "__call__", recording)
    x = torch.arange(6.0)
    with torch_pjrt.set_eager_mode("fused"):
        for offset in (0.75, 0.75):
            got = (x.to("pjrt").add(offset, alpha=3).mul(-2.5).sin()).cpu()
            torch.testing.assert_close(got, x.add(offset, alpha=3).mul(-2.5).sin())
    assert len(seen) >= 2
    assert not any(isinstance(a, (int, float, bool, complex)) for args in seen for a in args)
    numbers = [a for a in seen[-1] if getattr(a, "shape", None) == ()]
    assert numbers and all(any(a is b for b in seen[-2]) for a in numbers)  # cached arrays
