"""det and slogdet of real matrices in every layout, with their gradients, against the CPU.
PyTorch factors A^T for a contiguous real A and A otherwise, and its backward formulas
read the saved LU the same way by A's strides: a lowering that factored A^T for a
transposed or sliced A gave the transposed gradient (PyTorch's test_noncontiguous_samples)."""

import pytest
import torch
from helpers import assert_same

FUNCTIONS = {
    "det": torch.linalg.det,
    "slogdet": lambda t: torch.linalg.slogdet(t)[1],
    "logdet": torch.logdet,
}

LAYOUTS = {
    "contiguous": lambda base: base[:, :4].contiguous(),
    "transposed": lambda base: base[:, :4].t(),
    "sliced": lambda base: base[:, ::2],
    "batched_transposed": lambda base: base.reshape(2, 4, 4).transpose(-1, -2),
}


def _base(dtype):
    torch.manual_seed(0)
    return (torch.randn(4, 8, dtype=dtype) + 4 * torch.eye(4, 8, dtype=dtype)).abs()


def _value_and_grad(fn, layout, base):
    x = LAYOUTS[layout](base).detach().requires_grad_()
    y = fn(x)
    y.sum().backward()
    return y, x.grad


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_value_and_gradient_in_every_layout(name, layout, dtype):
    base = _base(dtype)
    expected = _value_and_grad(FUNCTIONS[name], layout, base)
    actual = _value_and_grad(FUNCTIONS[name], layout, base.to("pjrt"))
    assert_same(actual[0], expected[0], scale=4)
    assert_same(actual[1], expected[1], scale=16)


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_gradient_under_compile(layout):
    base = _base(torch.float64)
    fn = torch.compile(lambda t: torch.linalg.det(t).sum(), backend="pjrt", fullgraph=True)
    expected = _value_and_grad(torch.linalg.det, layout, base)
    x = LAYOUTS[layout](base.to("pjrt")).detach().requires_grad_()
    fn(x).backward()
    assert_same(x.grad, expected[1], scale=16)
