"""PyTorch's OpInfo database on pjrt against the CPU, forward and backward (float32).

A fixed slice of op_db that covers every family a real model uses; with
TORCH_PJRT_OPINFO_ALL=1 all of op_db. An op passes when every sample input
matches the CPU (a CPU fallback counts as passing: the report tracks those).
Failures listed in torch_pjrt/conformance_known_failures.py are expected; a
listed op that passes fails the test until its line is deleted.
"""

import os

import pytest

from torch_pjrt import conformance
from torch_pjrt.conformance_known_failures import KNOWN_FAILURES

CI_SLICE = (
    # elementwise unary
    "abs", "acos", "asin", "atan", "atanh", "ceil", "cos", "cosh", "exp", "exp2", "expm1",
    "floor", "frac", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt",
    "sigmoid", "sign", "sgn", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "erf",
    "erfinv", "lgamma", "digamma", "nan_to_num", "logit", "isnan", "isinf", "isfinite",
    "logical_not", "signbit", "deg2rad", "positive",
    # activations
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.elu", "nn.functional.selu", "nn.functional.leaky_relu",
    "nn.functional.hardswish", "nn.functional.hardsigmoid", "nn.functional.hardtanh",
    "nn.functional.softplus", "nn.functional.mish", "nn.functional.logsigmoid",
    "nn.functional.glu", "nn.functional.prelu", "nn.functional.threshold",
    # elementwise binary and ternary
    "add", "sub", "mul", "rsub", "div.no_rounding_mode", "div.trunc_rounding",
    "div.floor_rounding", "floor_divide", "remainder", "fmod", "pow", "atan2", "maximum",
    "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "hypot", "copysign", "xlogy", "lerp", "addcmul", "addcdiv", "where", "masked_fill",
    "clamp", "clamp_min", "clamp_max", "logaddexp", "isclose", "__rpow__",
    # reductions, scans, sorting
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "max.reduction_with_dim",
    "max.reduction_no_dim", "min.reduction_with_dim", "var", "std", "var_mean", "logsumexp",
    "norm", "linalg.vector_norm", "all", "any", "count_nonzero", "cumsum", "cumprod",
    "cummax", "logcumsumexp", "nansum", "aminmax", "topk", "sort", "argsort", "kthvalue",
    # matmul family
    "mm", "bmm", "matmul", "addmm", "addmv", "baddbmm", "mv", "dot", "outer", "einsum",
    "nn.functional.linear", "tensordot",
    # conv, pooling, normalization, resampling
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.batch_norm", "nn.functional.layer_norm", "nn.functional.group_norm",
    "nn.functional.rms_norm", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.bilinear", "nn.functional.pad.constant",
    "nn.functional.pad.reflect", "nn.functional.pixel_shuffle",
    # indexing, scatter, gather
    "gather", "scatter", "scatter_add", "scatter_reduce.sum", "scatter_reduce.amax",
    "index_select", "index_add", "index_copy", "index_fill", "index_put", "__getitem__",
    "take_along_dim", "masked_scatter", "masked_select", "nonzero", "select_scatter",
    "slice_scatter", "nn.functional.embedding", "nn.functional.one_hot", "searchsorted",
    # shape and views
    "cat", "stack", "hstack", "reshape", "view", "flatten", "unflatten", "permute",
    "transpose", "t", "squeeze", "unsqueeze", "expand", "repeat", "flip", "roll", "narrow",
    "select", "split", "chunk", "unbind", "movedim", "tril", "triu", "diag", "diagonal",
    "broadcast_to", "contiguous", "clone", "as_strided", "mT", "repeat_interleave",
    # softmax, attention, losses, distances
    "softmax", "log_softmax", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    "nn.functional.mse_loss", "nn.functional.l1_loss", "nn.functional.smooth_l1_loss",
    "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.kl_div", "nn.functional.cosine_similarity", "nn.functional.normalize",
    "nn.functional.scaled_dot_product_attention", "nn.functional.dropout", "cdist",
    # factories, random, casts, fills
    "zeros", "ones", "full", "arange", "linspace", "eye", "zeros_like", "full_like",
    "new_zeros", "empty", "randn", "bernoulli", "multinomial", "to", "float", "long", "bool",
    "bfloat16", "fill", "zero_",
)

# The slice runs at most this many samples per op, evenly spaced (the compile per
# sample shape dominates); TORCH_PJRT_OPINFO_ALL=1 runs every sample of every op.
CI_MAX_SAMPLES = 4

_ALL = os.environ.get("TORCH_PJRT_OPINFO_ALL", "").strip() not in ("", "0")
_OPS = conformance.select_ops(None if _ALL else CI_SLICE)
_MAX_SAMPLES = None if _ALL else CI_MAX_SAMPLES


@pytest.fixture(scope="module", autouse=True)
def _release_compiled():
    """The sweep compiles thousands of programs; drop them when the module is done."""
    yield
    conformance.release_compiled()


def test_slice_is_representative():
    assert len(set(CI_SLICE)) == len(CI_SLICE) >= 150


def test_known_failures_name_op_db_ops():
    names = {conformance.op_name(o) for o in conformance.all_ops()}
    for direction, listed in KNOWN_FAILURES.items():
        unknown = sorted(set(listed) - names)
        assert not unknown, f"known {direction} failures not in op_db: {unknown}"


@pytest.mark.parametrize("direction", conformance.DIRECTIONS)
@pytest.mark.parametrize("opinfo", _OPS, ids=conformance.op_name)
def test_opinfo(opinfo, direction):
    name = conformance.op_name(opinfo)
    outcome = conformance.run_direction(opinfo, direction, max_samples=_MAX_SAMPLES)
    if direction == "backward":
        conformance.release_compiled()  # keeps memory flat over hundreds of ops
    known = KNOWN_FAILURES[direction].get(name)
    verdict = conformance.verdict(name, direction, outcome)
    if verdict == "unexpected":
        pytest.fail(f"{name} {direction}: {outcome.reason}", pytrace=False)
    if verdict == "expected":
        pytest.xfail(f"known: {known} (now: {outcome.reason})")
    if verdict == "fixed":
        pytest.fail(f"{name} {direction} passes now ({outcome.status}) but is listed as a known "
                    f"failure ({known}): delete it from torch_pjrt/conformance_known_failures.py",
                    pytrace=False)
    if outcome.status == "skip":
        pytest.skip(outcome.reason)
