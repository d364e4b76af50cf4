"""Dtypes PyTorch's kernels refuse: where the CPU and CUDA raise for a dtype, pjrt raises.

A CPU kernel refuses a dtype with AT_DISPATCH's NotImplementedError (`"hypot_cpu" not
implemented for 'Long'`); CUDA's kernels refuse the same dtypes, with a few exceptions,
which pjrt (a device like CUDA) computes: CUDA_TAKES. The list comes from PyTorch's
OpInfos (the dtypes each op's CUDA kernels take and its CPU kernels do not);
`python tools/dtype_refusal_sweep.py --cpu-only-holes` prints it again and
tests/eager/test_dtype_refusals.py keeps it equal to that.
"""

from __future__ import annotations

import re

import torch

REFUSAL = re.compile(r"\"(\w+)\" not implemented for '(\w+)'")
# The other dtype refusals of the checks CPU and CUDA kernels share: those of complex
# numbers (clamp, relu, sign), and relu's of booleans (from torch 2.14 the kernel's
# NotImplementedError; 2.13's meta function raised it as a RuntimeError).
SHARED_CHECK = re.compile(r"\bcomplex (types|numbers)\b|^Boolean inputs not supported for")
ANY = "*"  # in CUDA_TAKES: the op's SHARED_CHECK refusals too (none today)

# aten op (base name: in-place and out= variants and the backward go with it) -> the
# dtypes, as the CPU's message names them, that its CUDA kernels take.
CUDA_TAKES: dict[str, frozenset[str]] = {
    "_upsample_bilinear2d_aa": frozenset({"BFloat16", "Half"}),
    "abs": frozenset({"Bool"}),
    "acos": frozenset({"ComplexHalf"}),
    "acosh": frozenset({"ComplexHalf"}),
    "angle": frozenset({"ComplexHalf"}),
    "asin": frozenset({"ComplexHalf"}),
    "asinh": frozenset({"ComplexHalf"}),
    "atan": frozenset({"ComplexHalf"}),
    "atanh": frozenset({"ComplexHalf"}),
    "avg_pool3d": frozenset({"BFloat16", "Half"}),
    "cos": frozenset({"ComplexHalf"}),
    "cosh": frozenset({"ComplexHalf"}),
    "div": frozenset({"ComplexHalf"}),
    "exp": frozenset({"ComplexHalf"}),
    "histc": frozenset({"Byte", "Char", "Int", "Long", "Short"}),
    "lerp": frozenset({"ComplexHalf"}),
    "log": frozenset({"ComplexHalf"}),
    "logaddexp": frozenset({"ComplexHalf"}),
    "multi_margin_loss": frozenset({"BFloat16", "Half"}),
    "multilabel_margin_loss": frozenset({"BFloat16", "Half"}),
    "pow": frozenset({"ComplexHalf"}),
    "prod": frozenset({"ComplexHalf"}),
    "rrelu_with_noise": frozenset({"Half"}),
    "rsqrt": frozenset({"ComplexHalf"}),
    "sigmoid": frozenset({"ComplexHalf"}),
    "sin": frozenset({"ComplexHalf"}),
    "sinh": frozenset({"ComplexHalf"}),
    "sqrt": frozenset({"ComplexHalf"}),
    "sum": frozenset({"ComplexHalf"}),
    "tan": frozenset({"ComplexHalf"}),
    "tanh": frozenset({"ComplexHalf"}),
    "trace": frozenset({"Bool", "ComplexHalf"}),
}


def base_name(op: torch._ops.OpOverload) -> str:
    """`op`'s name without namespace, overload, in-place mark, `_forward` or `_backward`."""
    name = op._schema.name.split("::")[-1].rstrip("_")
    for suffix in ("_backward", "_forward"):
        name = name.removesuffix(suffix)
    return name


def refuses(op: torch._ops.OpOverload, error: BaseException) -> bool:
    """Whether `error`, the CPU kernel's for a call of `op`, is a refusal of a dtype that
    CUDA makes too (so pjrt raises it): a NotImplementedError, AT_DISPATCH's of a dtype not
    in CUDA_TAKES, or one of the dtype checks CPU and CUDA share (`clamp is not supported
    for complex types`). Never another NotImplementedError: an op with no CPU kernel, or
    one only other devices implement (`_scaled_dot_product_fused_attention_overrideable`)."""
    if not isinstance(error, NotImplementedError):
        return False
    m = REFUSAL.search(str(error))
    if m is None and not SHARED_CHECK.search(str(error)):
        return False
    return (m.group(2) if m else ANY) not in CUDA_TAKES.get(base_name(op), ())
