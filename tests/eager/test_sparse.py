"""Sparse tensors on pjrt (eager/sparse.py), COO and the compressed layouts: real sparse pjrt
tensors whose kernels run on the CPU; values, layouts, devices and gradients as on the CPU,
in every eager mode."""

import warnings

import pytest
import torch

import torch_pjrt

pytestmark = [pytest.mark.usefixtures("eager_mode"),
              pytest.mark.filterwarnings("ignore:pjrt. .* has no lowering")]


def _sparse(device="cpu", dtype=torch.float32):
    i = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    v = torch.tensor([3.0, 4.0, 5.0, -1.0]).to(dtype)
    return torch.sparse_coo_tensor(i, v, (2, 3), device=device)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.layout == want.layout and got.dtype == want.dtype and got.shape == want.shape
    assert got.device.type == "pjrt"
    if got.layout == torch.sparse_coo:
        assert got._indices().device == got.device == got._values().device
        assert got.is_coalesced() == want.is_coalesced()
        got, want = got.to_dense(), want.to_dense()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_construction_and_metadata():
    s, c = _sparse("pjrt"), _sparse()
    assert s.device.type == "pjrt" and s.layout == torch.sparse_coo
    assert (s._nnz(), s.sparse_dim(), s.dense_dim()) == (c._nnz(), c.sparse_dim(), c.dense_dim())
    _same(s, c)
    _same(c.to("pjrt"), c)  # a CPU sparse tensor moved
    _same(torch.ones(2, 3).to_sparse().to("pjrt"), torch.ones(2, 3).to_sparse())
    back = s.cpu()
    assert back.device.type == "cpu" and back.layout == torch.sparse_coo
    assert torch.equal(back.to_dense(), c.to_dense())


def test_arithmetic_and_reductions():
    s, c = _sparse("pjrt"), _sparse()
    d = torch.arange(6.0).reshape(2, 3)
    _same(s + s, c + c)
    _same(s * 2, c * 2)
    _same(s.coalesce(), c.coalesce())
    _same(d.to("pjrt") + s, d + c)
    _same(torch.sparse.sum(s, 1), torch.sparse.sum(c, 1))
    _same(s.sum(), c.sum())
    _same(torch.sparse.mm(s, d.t().to("pjrt")), torch.sparse.mm(c, d.t()))
    with pytest.raises(RuntimeError, match="add\\(sparse, dense\\) is not supported"):
        s + d.to("pjrt")  # as on the CPU


def test_in_place_ops_write_the_pjrt_tensor():
    s, c = _sparse("pjrt"), _sparse()
    s.add_(s)
    c.add_(c)
    _same(s, c)
    s.mul_(0.5)
    c.mul_(0.5)
    _same(s, c)
    s.zero_()
    c.zero_()
    assert s._nnz() == 0 and s.device.type == "pjrt"
    t = _sparse("pjrt")
    t.copy_(_sparse(dtype=torch.float32) * 3)
    _same(t, _sparse() * 3)


def test_type_promotion():
    s = _sparse("pjrt", torch.int32)
    c = _sparse(dtype=torch.int32)
    _same(s / 2, c / 2)
    _same(s + _sparse("pjrt", torch.float64), c + _sparse(dtype=torch.float64))


def test_sparse_gradients():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    ref = torch.nn.Embedding(10, 3, sparse=True)
    ref.load_state_dict(emb.state_dict())
    emb.to("pjrt")
    idx = torch.tensor([1, 2, 1, 7])
    emb(idx.to("pjrt")).pow(2).sum().backward()
    ref(idx).pow(2).sum().backward()
    _same(emb.weight.grad, ref.weight.grad)
    torch.optim.SGD(emb.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(emb.weight.detach().cpu(), ref.weight.detach())


def test_values_backward():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0], requires_grad=True)
    dv = v.detach().to("pjrt").requires_grad_()
    for values in (v, dv):
        s = torch.sparse_coo_tensor(i.to(values.device), values, (2, 3))
        (s.to_dense() * torch.arange(6.0, device=values.device).reshape(2, 3)).sum().backward()
    torch.testing.assert_close(dv.grad.cpu(), v.grad)


def test_counted_as_cpu_fallbacks():
    torch_pjrt.counters.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (_sparse("pjrt") * 2).to_dense()
    assert torch_pjrt.metrics()["cpu_fallbacks"].get("aten.mul.Tensor", 0) >= 1


DENSE = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_layouts(layout):
    def to(t):
        return t.to_sparse_bsr((1, 1)) if layout == "bsr" else getattr(t, f"to_sparse_{layout}")()

    s, c = to(DENSE.to("pjrt")), to(DENSE)
    assert s.layout == c.layout and s.device.type == "pjrt" and s.values().device == s.device
    _same(s, c)
    _same(s * 2, c * 2)
    _same(to(DENSE).to("pjrt"), c)
    assert s.cpu().layout == c.layout


def test_csr_in_place_and_products():
    s, c = DENSE.to("pjrt").to_sparse_csr(), DENSE.to_sparse_csr()
    m = torch.randn(3, 4)
    _same(s @ m.to("pjrt"), c @ m)
    s.mul_(3)
    c.mul_(3)
    _same(s, c)
    s.zero_()  # fewer specified elements than before: the pjrt tensor takes the new ones
    c.zero_()
    assert s._nnz() == c._nnz() and s.crow_indices().device == s.device
    _same(s, c)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax"])
def test_sparse_mm_reduce_backward(reduce):
    # amax's CPU kernel keeps the argmax for the backward only for an input that requires
    # grad: the CPU fallback passes that flag on (without it the backward crashed)
    a = DENSE.to_sparse_csr().requires_grad_()
    b = torch.randn(3, 4, requires_grad=True)
    da = DENSE.to("pjrt").to_sparse_csr().requires_grad_()
    db = b.detach().to("pjrt").requires_grad_()
    torch.sparse.mm(a, b, reduce).sum().backward()
    torch.sparse.mm(da, db, reduce).sum().backward()
    torch.testing.assert_close(db.grad.cpu(), b.grad)
    torch.testing.assert_close(da.grad.to_dense().cpu(), a.grad.to_dense())
