"""Indexing lowerings (lowering/families/indexing.py) against CPU PyTorch, in every eager mode:
the cases PyTorch's own test_indexing.py found."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """The CPU's in-order index_put_ (left alone it splits the writes across threads, and
    the last write to a repeated position is any thread's)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("shape,index_dims", [((15,), (0,)), ((7, 3), (0,)), ((6, 5, 4), (0, 2))],
                         ids=["1d", "rows", "two_dims"])
def test_index_put_repeated_positions_last_wins(shape: tuple, index_dims: tuple) -> None:
    # the last value written to a repeated position wins, as the CPU's in-order kernel and
    # use_deterministic_algorithms have it (PyTorch's test_index_put_non_accumulate_
    # deterministic): XLA leaves the order of a scatter's updates to the backend, and
    # XLA:CPU's is in order, without being asked
    n = 25000
    x = torch.rand(shape)
    indices: list = [None] * len(shape)
    for d in index_dims:
        indices[d] = torch.randint(-shape[d], shape[d], (n,))
    key = tuple(slice(None) if i is None else i for i in indices)
    values = torch.rand(torch.empty(shape)[key].shape)
    with _deterministic():
        expected = x.clone()
        expected[key] = values
    t, dkey, v = to_device((x, list(key), values))
    if len(shape) == 1:
        assert_same(t.index_put((dkey[0],), v), expected)
    t[tuple(dkey)] = v  # index_put_, the untouched dimensions as None
    assert_same(t, expected)


def test_index_put_mask_then_none() -> None:
    # a mask with a None after it in index_put_'s list (PyTorch's
    # test_multi_dimensional_bool_mask_assignment): the mask covers the dimensions it
    # starts at, the None the last one
    v = torch.tensor([[[[1], [2]], [[3], [4]]]])
    mask = torch.tensor([[1, 0], [0, 1]], dtype=torch.bool)
    for value in (torch.tensor(0), torch.tensor([7])):
        expected = torch.ops.aten.index_put_(v.clone(), [None, mask, None], value)
        t, m = to_device((v, mask))
        assert_same(torch.ops.aten.index_put_(t, [None, m, None], value), expected)
        t, m = to_device((v, mask))
        assert_same(torch.ops.aten.index_put_(t, [None, m], value), expected)


@pytest.mark.parametrize("dtype,value", [
    (torch.float32, float("inf")), (torch.float32, float("nan")), (torch.int64, 2.7),
    (torch.complex64, 1 + 2j), (torch.bool, 3), (torch.float64, 1 / 3), (torch.int32, True),
], ids=str)
def test_copy_of_a_python_number(dtype, value) -> None:
    # PyTorch's test_params_invalidated_with_grads_invalidated_between_unscale_and_step:
    # grad.copy_(torch.inf) reached the kernel as the number and raised AttributeError
    got, expected = (torch.zeros(6, dtype=dtype, device=d)[::2].copy_(value)
                     for d in ("pjrt", "cpu"))
    assert_same(got, expected)
