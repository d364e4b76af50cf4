"""Matrix products with out_dtype (`aten::mm.dtype`, `bmm.dtype`, `addmm.dtype`): float16 and
bfloat16 operands, float32 results, as CUDA's kernels give them (the CPU build has none: the
reference is the float32 product of the same operands)."""

import pytest
import torch
from helpers import assert_same
from tolerance import assert_within, sum_bound

pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_out_dtype_products_are_float32_products(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g).to(dtype) for s in ((3, 4), (4, 5)))
    bias = torch.randn(3, 5, generator=g)
    ref = a.float() @ b.float()
    pa, pb = a.to("pjrt"), b.to("pjrt")
    assert_same(torch.ops.aten.mm.dtype(pa, pb, torch.float32), ref)
    assert_same(torch.ops.aten.bmm.dtype(pa[None], pb[None], torch.float32), ref[None])
    got = torch.ops.aten.addmm.dtype(bias.to("pjrt"), pa, pb, torch.float32, beta=2, alpha=3)
    terms = 2 * bias.abs() + 3 * (a.abs().float() @ b.abs().float())
    assert_within(got, 2 * bias + 3 * ref, sum_bound(terms, torch.float32, terms=a.shape[1] + 1))


def test_out_dtype_refuses_what_cuda_refuses():
    x = torch.ones(2, 2, device="pjrt")
    with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype"):
        torch.ops.aten.mm.dtype(x, x, torch.bfloat16)


def test_out_dtype_product_compiled():
    a = torch.randn(3, 4).to(torch.bfloat16)
    fn = torch.compile(lambda x, y: torch.ops.aten.mm.dtype(x, y, torch.float32),
                       backend="pjrt", fullgraph=True)
    assert_same(fn(a.to("pjrt"), a.t().to("pjrt")), a.float() @ a.t().float())
