"""gather and the scatters with a 0-d index and a 1-d self, which PyTorch counts as a 1-d
index of one element (gather's result is 0-d): against the CPU, in every eager mode."""

import pytest
import torch
from helpers import assert_same

pytestmark = pytest.mark.usefixtures("eager_mode")

CALLS = {
    "gather": lambda x, i: torch.gather(x, 0, i),
    "gather_neg_dim": lambda x, i: torch.gather(x, -1, i),
    "scatter_src": lambda x, i: x.scatter(0, i, torch.tensor(5.0, device=x.device)),
    "scatter_value": lambda x, i: x.scatter(0, i, 7.0),
    "scatter_add": lambda x, i: x.scatter_add(0, i, torch.tensor([5.0, 6.0], device=x.device)),
    "scatter_reduce": lambda x, i: x.scatter_reduce(0, i, torch.tensor(5.0, device=x.device),
                                                    "amax"),
}


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("position", [0, 2])
def test_zero_dim_index_on_a_vector(name, position):
    x = torch.arange(3.0)
    i = torch.tensor(position)
    expected = CALLS[name](x, i)
    assert_same(CALLS[name](x.to("pjrt"), i.to("pjrt")), expected)


_BOOL_SCATTERS = {
    "scatter_add_": lambda b, i, s: b.scatter_add_(0, i, s),
    "scatter_add": lambda b, i, s: b.scatter_add(0, i, s),
    "scatter_ add": lambda b, i, s: b.scatter_(0, i, s, reduce="add"),
    "scatter_ multiply": lambda b, i, s: (~b).scatter_(0, i, s, reduce="multiply"),
    **{f"scatter_reduce {r} {inc}": (
        lambda b, i, s, r=r, inc=inc: (~b).scatter_reduce(0, i, s, r, include_self=inc))
       for r in ("sum", "prod", "amax", "amin") for inc in (True, False)},
}


@pytest.mark.parametrize("name", list(_BOOL_SCATTERS))
def test_bool_scatter_reductions(name):
    # PyTorch's test_scatter_add_bool: add refused bool (the CPU's bool sum is an or, its
    # product an and), and scatter_reduce's identities of include_self=False raised
    fn = _BOOL_SCATTERS[name]
    index = torch.tensor([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]])
    src = torch.tensor([[True, False, True, True, False]] * 2)
    base = torch.zeros(3, 5, dtype=torch.bool)
    assert_same(fn(base.to("pjrt"), index.to("pjrt"), src.to("pjrt")), fn(base, index, src))
