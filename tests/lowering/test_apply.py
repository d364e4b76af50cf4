"""A lowering gets the same kinds of values from every mode: a Python number that a compiled
graph holds as a constant (a Scalar, or a number where a Tensor is expected) reaches it as a
0-d array, as eager's run-time values do (torch_pjrt/lowering/apply.py)."""

import dataclasses

import jax
import pytest
import torch
from helpers import assert_same, to_device

from torch_pjrt.eager import opspec
from torch_pjrt.lowering import apply

aten = torch.ops.aten

# Ops whose lowerings compute with a Scalar (or a number in a Tensor's place), each called
# with Python constants; under torch.compile those are constants of the graph.
CASES = {
    "pow_2": lambda x: x.pow(2),  # RMSNorm's variance, Llama's: the static-cache failure
    "pow_half": lambda x: x.abs().pow(0.5),
    "pow_minus_one": lambda x: torch.pow(x + 3, -1),
    "pow_int": lambda x: (x * 3).to(torch.int64).pow(3),
    "rpow": lambda x: 2 ** x,
    "add_alpha": lambda x: torch.add(x, x, alpha=2),
    "sub_number": lambda x: x - 1.5,
    "mul_bool": lambda x: x * True,
    "where_number": lambda x: torch.where(x > 0, x, 0.0),
    "masked_fill": lambda x: x.masked_fill(x < 0, float("-inf")),
    "clamp": lambda x: x.clamp(min=-0.5, max=0.5),
    "leaky_relu": lambda x: torch.nn.functional.leaky_relu(x, 0.2),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x, -0.3, 0.3),
    "threshold": lambda x: torch.nn.functional.threshold(x, 0.1, 20.0),
    "lerp": lambda x: torch.lerp(x, x.flip(0), 0.3),
    "addcmul": lambda x: torch.addcmul(x, x, x, value=0.5),
    "fmod": lambda x: torch.fmod(x, 0.7),
    "remainder": lambda x: torch.remainder(x, 0.7),
    "div_floor": lambda x: torch.div(x, 0.3, rounding_mode="floor"),
    "full": lambda x: torch.full(x.shape, 7, device=x.device) + x,
    "eq_number": lambda x: (x.round() == 1).float(),
    "int_clamp": lambda x: torch.clamp_max((x * 4).int(), 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_python_constants_in_compiled_graphs(case):
    torch._dynamo.reset()
    x = torch.randn(4, 6)
    fn = CASES[case]
    compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
    assert_same(compiled(*to_device((x,))), fn(x))


def test_lowering_receives_arrays_for_run_time_numbers():
    """apply.invoke hands Scalars and numbers in Tensor positions to the lowering as arrays,
    and leaves a Scalar equal to its schema default a Python value, in any mode."""
    seen = {}
    spec = opspec.spec(aten.add.Tensor)

    def spy(x, y, *, alpha=1):
        seen.update(y=y, alpha=alpha)
        return x

    fake = dataclasses.replace(spec, lowering=dataclasses.replace(spec.lowering, fn=spy))
    apply.invoke(fake, [jax.numpy.zeros(3), 2.5, 1], None, None)
    assert isinstance(seen["y"], jax.Array) and seen["alpha"] == 1
    assert isinstance(seen["alpha"], int)
    apply.invoke(fake, [jax.numpy.zeros(3), 2.5, 3], None, None)
    assert isinstance(seen["alpha"], jax.Array) and int(seen["alpha"]) == 3
