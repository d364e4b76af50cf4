"""Result dtypes come from the meta function; where it disagrees with the CPU kernel,
eager/meta.py corrects it. The sweep (tools/meta_dtype_sweep.py) finds every such op."""

import importlib.util
import pathlib

import pytest
import torch

from tests.helpers import compare
from torch_pjrt.eager import meta

pytestmark = pytest.mark.usefixtures("eager_mode")

_SWEEP = pathlib.Path(__file__).parents[2] / "tools" / "meta_dtype_sweep.py"

# Differences no program reaches through eager ops: autograd calls mish_backward with
# both tensors of one dtype, and _weight_norm_interface with a g of the weight's rank.
KNOWN = {"aten.mish_backward.default", "aten._weight_norm_interface.default"}


def _sweep():
    spec = importlib.util.spec_from_file_location("meta_dtype_sweep", _SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_meta_dtype_difference_is_corrected_or_known(eager_mode):
    if eager_mode != "strict":
        pytest.skip("the sweep runs no pjrt op: once is enough")
    found = _sweep().differences()
    assert "aten.pow.Tensor_Scalar" in found  # PyTorch's bug the correction is for
    new = set(found) - set(meta._CPU_RESULT_DTYPES) - KNOWN
    assert not new, {op: found[op][:2] for op in new}


@pytest.mark.parametrize("exponent", [False, True, 0, 1, 2, 1.5, -1.0])
def test_bool_tensor_to_a_power(exponent):
    # bool ** bool is bool on CPU (the meta function said int64); bool ** int is int64
    x = torch.tensor([True, False, True])
    compare(lambda t: t ** exponent, x)
    compare(lambda t: torch.pow(t, exponent) + 0, x)
