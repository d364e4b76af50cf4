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


@pytest.mark.parametrize("mask", [False, True], ids=["positions", "mask"])
def test_index_put_accumulate_bool(mask: bool) -> None:
    # the CPU accumulates booleans as a logical or, repeated positions included
    x = torch.tensor([False, True, False, False, True])
    values = torch.tensor([True, False, False]) if not mask else torch.tensor([True, False])
    index = (torch.tensor([0, 0, 3]) if not mask
             else torch.tensor([True, False, False, True, False]))
    expected = x.clone().index_put_((index,), values, accumulate=True)
    t, i, v = to_device((x, index, values))
    assert_same(t.index_put_((i,), v, accumulate=True), expected)
    src = torch.ones(3, 2, 4, dtype=torch.bool)
    expected = src.clone().index_put_((torch.tensor([0, 2, 1]),), src, accumulate=True)
    s, i = to_device((src, torch.tensor([0, 2, 1])))
    assert_same(s.index_put_((i,), s.clone(), accumulate=True), expected)
