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
