"""The ecosystem tests' judge (differential.py): a float32 run as accurate as the CPU's
passes, a model that amplifies float32's rounding passes as "rounding" only when the
float64 runs agree, and a wrong kernel differs in float64 too, so it is never taken for
rounding."""

from __future__ import annotations

import torch
from differential import compare_training

# 1 - 2**-24: p - X_NEAR_ONE is 2**-24, exactly, in float32 and float64
X_NEAR_ONE = 1 - 2.0 ** -24


class Kinked(torch.nn.Module):
    """out = x[0] + w * relu(p - x[1]), with p - x[1] = 2**-24: the ReLU's input sits
    within float32's rounding of 1.0 (which rounds 1 + 2**-24 to 1), so a side that rounds
    it below zero drops the gradient of p and the output stays as accurate.
    `shift_on_pjrt`: on pjrt, subtract one float32 ulp of 1.0 from the ReLU's input, in
    float32 only (what rounding does) or in every dtype (what a wrong kernel does)."""

    def __init__(self, shift_on_pjrt: str = ""):
        super().__init__()
        self.p = torch.nn.Parameter(torch.ones(()))
        self.w = torch.nn.Parameter(torch.ones(()))
        self.shift_on_pjrt = shift_on_pjrt

    def forward(self, x):
        v = self.p - x[1]
        if x.device.type == "pjrt" and (self.shift_on_pjrt == "always" or (
                self.shift_on_pjrt == "float32" and x.dtype == torch.float32)):
            v = v - 2.0 ** -23
        return (x[0] + self.w * torch.relu(v)).reshape(1)


def _judged(shift: str):
    return compare_training(Kinked(shift), torch.tensor([1.0, X_NEAR_ONE]),
                            lambda out, _: out.sum(), mode="fused", steps=2)


def test_accurate_run_passes():
    result = _judged("")
    assert result.verdict == "pass" and result.float64 is None, result.gaps
    result.check()


def test_float32_kink_is_rounding_when_float64_agrees():
    result = _judged("float32")
    assert not result.accurate, "the dropped gradient of p was not seen"
    assert result.verdict == "rounding", (result.gaps, result.float64 and result.float64.gaps)
    result.check()


def test_wrong_kernel_is_never_rounding():
    result = _judged("always")
    assert result.verdict == "differs"
    assert result.float64 is not None and not result.float64.accurate
    try:
        result.check()
    except AssertionError as exc:
        assert "in float64" in str(exc)
    else:
        raise AssertionError("a wrong kernel passed the check")
