"""Indexing lowerings (lowering/families/indexing.py) against CPU PyTorch, in every eager mode:
the cases PyTorch's own test_indexing.py found."""

from __future__ import annotations

from itertools import product

import pytest
import torch
from helpers import assert_same, to_device

pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_copy_scalars(dtype: torch.dtype) -> None:
    # a 0-d index or source stands for one element, as the CPU reads them: every mix of 0-d
    # and one-element target, index and source
    for size_t, size_i, size_s in product([(), (1,)], repeat=3):
        target = torch.randn(size_t).to(dtype)
        index = torch.zeros(size_i, dtype=torch.long)
        source = torch.ones(size_s).to(dtype)
        expected = target.clone().index_copy_(0, index, source)
        t, i, s = to_device((target, index, source))
        assert_same(t.index_copy_(0, i, s), expected)
