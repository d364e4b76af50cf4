"""The op cache (eager/op_cache.py) against CPU PyTorch, in every eager mode: programs whose
result dtype comes from torch's default dtype are not reused after it changes."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same, to_device

pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("first,then", [(torch.float32, torch.float64),
                                        (torch.float64, torch.float32)],
                         ids=["float_then_double", "double_then_float"])
def test_default_dtype_change(first: torch.dtype, then: torch.dtype) -> None:
    # integer true division and a float scalar on an integer tensor take the default dtype
    # (PyTorch's test_type_promotion runs each test under both defaults in one process)
    a = torch.arange(1, 6)
    b = torch.tensor([2, 2, 2, 2, 2], dtype=torch.int16)
    before = torch.get_default_dtype()
    try:
        for default in (first, then, first):
            torch.set_default_dtype(default)
            x, y = to_device((a, b))
            for fn in (lambda p, q: p / p, lambda p, q: p / 2.0, lambda p, q: torch.div(p, q),
                       lambda p, q: q * 1.5, lambda p, q: torch.true_divide(q, p)):
                assert_same(fn(x, y), fn(a, b))
    finally:
        torch.set_default_dtype(before)
