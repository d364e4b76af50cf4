"""FX nodes other than ATen ops in compiled graphs: Python functions on sizes
(torch.sym_max, math.floor, operator.*), tensor constants (get_attr, lift_fresh_copy)
and the prims cast of float math on sizes; and ATen's conjugate and negative views, which
eager mode keeps as tensor flags. Each must run in the graph's program and give CPU
eager's values and dtypes, not crash nor leave the graph to run op by op."""

import math

import pytest
import torch

import torch_pjrt


def _compiled_matches_cpu(fn, *args, dynamic=None, compiled=None):
    expected = fn(*args)
    compiled = compiled or torch.compile(fn, backend="pjrt", dynamic=dynamic)
    actual = compiled(*(a.to("pjrt") for a in args))
    assert actual.device.type == "pjrt"
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected)
    assert torch_pjrt.counters.value("compile_eager_graphs") == 0
    assert torch_pjrt.counters.value("compiled_graphs") >= 1
    return compiled


SIZE_FUNCTIONS = {
    "sym_max": lambda x: x.new_zeros(torch.sym_max(x.shape[0], 3)) + x.sum(),
    "sym_min": lambda x: x[:torch.sym_min(x.shape[0], 3)] * 2,
    "sym_max_offset": lambda x: x[torch.sym_max(0, x.shape[0] - 4):] * 3,
    "math_floor": lambda x: x.reshape(-1)[:math.floor(x.shape[0] / 4)] * 2,
    "math_ceil": lambda x: x.reshape(-1)[:math.ceil(x.shape[0] / 4)] * 2,
    "math_sqrt": lambda x: x * math.sqrt(x.shape[-1]),
    "pow_float": lambda x: x / (x.shape[0] ** 0.5),
    "floordiv": lambda x: x.view(x.shape[0] // 2, -1) + 1,
    "python_min": lambda x: x.new_ones(x.shape[0], x.shape[0]).tril(-min(x.shape[0], 3)) @ x,
}


@pytest.mark.parametrize("name", SIZE_FUNCTIONS)
def test_python_functions_of_sizes(name):
    fn = SIZE_FUNCTIONS[name]
    compiled = _compiled_matches_cpu(fn, torch.randn(6, 4), dynamic=True)
    # a second size runs the same graph with its own values (not the first call's)
    _compiled_matches_cpu(fn, torch.randn(10, 4), compiled=compiled)


CONSTANTS = {
    "float": lambda x: x + torch.tensor([1.0, 2.0, -3.0, 4.5], device=x.device),
    "int64": lambda x: x * torch.tensor([1, 2, 3, 4], device=x.device),
    "bool": lambda x: x.masked_fill(torch.tensor([True, False, True, False], device=x.device),
                                    0.0),
    "bfloat16": lambda x: x * torch.tensor([1.5, 2, 3, 4], dtype=torch.bfloat16,
                                           device=x.device),
    "2d": lambda x: x @ torch.tensor([[1.0, 0.0], [0.5, 2.0], [0.0, -1.0], [3.0, 1.0]],
                                     device=x.device),
    "zero_dim_cpu": lambda x: x * torch.tensor(3.0),
    "new_tensor": lambda x: x + x.new_tensor([1.0, 2.0, 3.0, 4.0]),
    "lift_fresh_copy": lambda x: x + torch.ops.aten.lift_fresh_copy(
        torch.tensor([1.0, 2.0, 3.0, 4.0])).to(x.device),
}


@pytest.mark.parametrize("name", CONSTANTS)
def test_tensor_constants(name):
    _compiled_matches_cpu(CONSTANTS[name], torch.randn(6, 4))


def test_constants_of_two_functions_keep_their_own_values():
    """Graphs that differ only in a constant's values are two programs."""
    x = torch.randn(3, 4)
    a = torch.compile(lambda x: x + torch.tensor([1.0, 2, 3, 4], device=x.device),
                      backend="pjrt")(x.to("pjrt"))
    torch._dynamo.reset()
    b = torch.compile(lambda x: x + torch.tensor([5.0, 6, 7, 8], device=x.device),
                      backend="pjrt")(x.to("pjrt"))
    torch.testing.assert_close(a.cpu(), x + torch.tensor([1.0, 2, 3, 4]))
    torch.testing.assert_close(b.cpu(), x + torch.tensor([5.0, 6, 7, 8]))


def test_constant_with_gradient():
    w = torch.randn(6, 4, requires_grad=True)
    c = torch.tensor([1.0, -2.0, 3.0, 0.5])
    (w * c).pow(2).sum().backward()
    wd = w.detach().to("pjrt").requires_grad_()
    fn = torch.compile(lambda w: (w * torch.tensor([1.0, -2.0, 3.0, 0.5], device=w.device))
                       .pow(2).sum(), backend="pjrt")
    fn(wd).backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad)


FLAG_VIEWS = {
    "conj_of_input": lambda x, y: x.conj() * y,
    "conj_of_result": lambda x, y: (x * y).conj(),
    "conj_twice": lambda x, y: (x.conj() * y).conj() + x.conj(),
    "neg_view": lambda x, y: torch.ops.aten._neg_view(x * y) + y,
    "view_as_real_of_conj": lambda x, y: torch.view_as_real(x.conj().resolve_conj()) * 2,
}


@pytest.mark.parametrize("name", FLAG_VIEWS)
def test_conjugate_and_negative_views(name):
    x, y = torch.randn(6, dtype=torch.complex64), torch.randn(6, dtype=torch.complex64)
    fn = FLAG_VIEWS[name]
    expected = fn(x, y).resolve_conj().resolve_neg()
    actual = torch.compile(fn, backend="pjrt")(x.to("pjrt"), y.to("pjrt"))
    torch.testing.assert_close(actual.cpu().resolve_conj().resolve_neg(), expected)
    assert torch_pjrt.counters.value("compile_eager_graphs") == 0
