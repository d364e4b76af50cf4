"""A few ops from each family, differential against CPU (the OpInfo suite is the full check)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import compare

pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("fn", [
    lambda x, y: x + y, lambda x, y: x * 2.5 - y, lambda x, y: x / y, lambda x, y: x > y,
    lambda x, y: torch.where(x > 0, x, y), lambda x, y: x @ y.t(),
    lambda x, y: torch.cat([x, y], 1), lambda x, y: (x.sum(), x.mean(1), x.max(0)),
    lambda x, y: F.softmax(x, -1), lambda x, y: F.log_softmax(y, 0),
])
def test_binary_family(fn):
    compare(fn, torch.randn(4, 5), torch.randn(4, 5))


def test_integer_division_and_remainder_follow_python_signs():
    a = torch.tensor([-7, -3, 3, 7])
    b = torch.tensor([2, -2, -2, 2])
    compare(lambda a, b: (a // b, a % b, torch.fmod(a, b), a / b), a, b)
