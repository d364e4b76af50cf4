"""torch.autocast("pjrt")'s cast policy is CUDA's: the table in torch_pjrt.amp is ATen's
lists, the dispatcher holds a pjrt kernel for exactly its entries, and every entry's
result dtype on (fake) pjrt tensors is the one CUDA autocast gives on (fake) CUDA ones."""

import os
import re

import pytest
import torch
from policy_samples import (
    FALLTHROUGH,
    SAMPLES,
    cuda_dtype,
    expected_dtype,
    first_float,
    prepare,
)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from torch_pjrt import amp

LOW = (torch.bfloat16, torch.float16)

# CUDA kernels that check for a real CUDA device, so that fake CUDA tensors cannot run
# them: for these the table alone says what CUDA does.
CUDA_NEEDS_DEVICE = {
    "aten::_thnn_fused_gru_cell": "CUDA's fused GRU cell kernel asks for a CUDA device",
    "aten::gru_cell": "goes to CUDA's fused GRU cell kernel",
    "aten::grid_sampler": "asks whether cuDNN is usable",
}
# Neither pjrt nor the Meta key has a kernel for it: checked by registration only.
NO_FAKE_KERNEL = {
    "aten::_thnn_fused_gru_cell": "no Meta kernel (a CUDA-only op)",
    "aten::gru_cell": "goes to _thnn_fused_gru_cell on PrivateUse1",
}


def _macro_entries(text: str, macro: str) -> list[str]:
    """The `_(op)` / `_(op, overload)` entries of one AT_FORALL_* list of autocast_mode.h."""
    lines = text[text.index(f"#define {macro}(_)"):].splitlines()
    body = []
    for line in lines[1:]:
        body.append(line)
        if not line.rstrip().endswith("\\"):
            break
    found = re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", "\n".join(body))
    return [f"aten::{op}.{overload}" if overload else f"aten::{op}" for op, overload in found]


def _header_policy() -> dict[str, str]:
    include = torch.utils.cpp_extension.include_paths()[0]
    with open(os.path.join(include, "ATen", "autocast_mode.h")) as f:
        text = f.read()
    table = {}
    for macro, policy in (("AT_FORALL_LOWER_PRECISION_FP", "lower_precision_fp"),
                          ("AT_FORALL_FP32", "fp32"),
                          ("AT_FORALL_FP32_SET_OPT_DTYPE", "fp32_set_opt_dtype"),
                          ("AT_FORALL_PROMOTE", "promote")):
        table.update(dict.fromkeys(_macro_entries(text, macro), policy))
    start = text.index("#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(_)")
    block = text[start:text.index("#define AT_FORALL_PROMOTE", start)]
    table.update({f"aten::{name}": "fp32_append_dtype"
                  for name in re.findall(r'"(\w+\.\w+)"', block)})
    return table


def test_table_is_atens_lists():
    """POLICY is the AT_FORALL_* lists of the installed ATen, plus the refused op."""
    import torch.utils.cpp_extension  # noqa: F401 - include_paths

    header = _header_policy()
    table = {k: v for k, v in amp.POLICY.items() if v != "refused"}
    assert table == header
    assert len(amp.POLICY) == 117  # docs/amp.md quotes this size


def test_registered_kernels_are_the_table_and_cudas():
    assert amp.registered() == set(amp.POLICY)
    cuda = amp.registered("AutocastCUDA")
    assert set(amp.POLICY) <= cuda
    # the rest of CUDA's are named (not every build or release of torch has each of them)
    assert cuda - set(amp.POLICY) <= set(amp.CUDA_ONLY)
    assert {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"} <= cuda


def test_every_entry_has_a_sample():
    assert set(SAMPLES) == {k for k, v in amp.POLICY.items() if v != "refused"}


def _fake_pjrt_dtype(sample, args, dtype) -> torch.dtype:
    torch.empty(0, device="pjrt")  # the backend's kernels are in place
    with FakeTensorMode():
        fake = tree_map(lambda a: torch.empty(a.shape, dtype=a.dtype, device="pjrt")
                        if isinstance(a, torch.Tensor) else a, args)
        with torch.autocast("pjrt", dtype=dtype):
            return first_float(sample.fn(*fake)).dtype


CASES = [(name, mixed) for name in SAMPLES for mixed in
         ((True, False) if amp.POLICY[name] == "promote" else (True,))]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name,mixed", CASES + [(name, True) for name in FALLTHROUGH],
                         ids=lambda v: v if isinstance(v, str) else ("mixed" if v else "low"))
def test_result_dtype_is_cudas(name, mixed, dtype):
    """On fake tensors (dtype propagation only, no programs): pjrt's result dtype is the
    policy's, and CUDA autocast's."""
    policy = amp.POLICY.get(name, "fallthrough")
    sample = SAMPLES.get(name) or FALLTHROUGH[name]
    torch.manual_seed(0)
    args = prepare(policy, sample.make(), dtype, mixed=mixed)
    if policy == "fallthrough":  # PyTorch's own result dtype, with no autocast
        want = first_float(sample.fn(*args)).dtype
    else:
        want = expected_dtype(policy, args, dtype)
    if name not in CUDA_NEEDS_DEVICE:
        assert cuda_dtype(sample, args, dtype) == want
    if name in NO_FAKE_KERNEL:
        pytest.skip(NO_FAKE_KERNEL[name])
    assert _fake_pjrt_dtype(sample, args, dtype) == want


def test_binary_cross_entropy_is_refused_as_on_cuda():
    x = torch.rand(4, device="pjrt")
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy.*autocast"):
            torch.nn.functional.binary_cross_entropy(x, x)
    torch.nn.functional.binary_cross_entropy(x, x)  # allowed outside autocast


def test_docs_table_is_current():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "amp.md")
    with open(path) as f:
        assert amp.markdown_table() in f.read(), "regenerate docs/amp.md's policy table"
