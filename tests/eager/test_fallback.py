"""Ops without a lowering run on the CPU, counted and warned once; or raise when told to."""

import subprocess
import sys
import warnings

import torch

import torch_pjrt

# An op with only a CPU kernel and no lowering or decomposition.
UNLOWERED = torch.ops.aten._test_functorch_fallback.default if hasattr(
    torch.ops.aten, "_test_functorch_fallback") else None


def _unlowered_call(x):
    return torch.ops.aten.heaviside.default(x, x) if UNLOWERED is None else UNLOWERED(x, x)


def test_fallback_is_counted_and_warned_once():
    torch_pjrt.counters.reset()
    x = torch.randn(5)
    d = x.to("pjrt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r1 = torch.ops.aten.logcumsumexp.default(d, 0)
        r2 = torch.ops.aten.logcumsumexp.default(d, 0)
    torch.testing.assert_close(r1.cpu(), torch.logcumsumexp(x, 0))
    assert r2.device.type == "pjrt"
    fallbacks = torch_pjrt.metrics()["cpu_fallbacks"]
    if "aten.logcumsumexp.default" in fallbacks:  # until it gets a lowering
        assert fallbacks["aten.logcumsumexp.default"] == 2
        assert sum("logcumsumexp" in str(w.message) for w in caught) == 1


def test_fallback_keeps_in_place_semantics_through_views():
    from torch_pjrt.eager import fallback

    x = torch.randn(4, 4)
    d = x.to("pjrt")
    fallback.cpu_fallback(torch.ops.aten.mul_.Tensor, (d[1:3, ::2], torch.tensor(3.0)), {})
    x[1:3, ::2].mul_(3.0)
    torch.testing.assert_close(d.cpu(), x)


def test_fallback_off_raises_naming_the_op():
    code = (
        "import torch, torch_pjrt\n"
        "from torch_pjrt.eager import fallback\n"
        "try:\n"
        "    fallback.cpu_fallback(\n"
        "        torch.ops.aten.mul.Tensor, (torch.ones(2, device='pjrt'), 2), {})\n"
        "except RuntimeError as e:\n"
        "    print('raised', e)\n"
    )
    env = {"TORCH_PJRT_CPU_FALLBACK": "0", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**env, **{"HOME": "/root"}})
    assert "raised" in out.stdout and "aten.mul.Tensor" in out.stdout, out.stderr
