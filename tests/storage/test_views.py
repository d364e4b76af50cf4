"""Views share their storage and report PyTorch's metadata; in-place ops on views
change the base and every other view, exactly as on CPU."""

import random

import jax.numpy as jnp
import pytest
import torch
from helpers import assert_same

pytestmark = pytest.mark.usefixtures("eager_mode")


def _pair(shape=(4, 6)):
    x = torch.randn(*shape)
    return x, x.to("pjrt")


VIEWS = {
    "view": lambda t: t.view(6, 4),
    "slice": lambda t: t[1:3, ::2],
    "t": lambda t: t.t(),
    "permute": lambda t: t.reshape(2, 2, 6).permute(2, 0, 1),
    "expand": lambda t: t[:1].expand(3, 6),
    "select": lambda t: t.select(1, 2),
    "narrow": lambda t: t.narrow(1, 1, 3),
    "unfold": lambda t: t.unfold(1, 3, 2),
    "diagonal": lambda t: t.diagonal(),
    "as_strided": lambda t: t.as_strided((3, 3), (5, 2), 1),
    "detach": lambda t: t.detach(),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "split": lambda t: t.split(2, 1)[1],
    "view_dtype": lambda t: t.view(torch.int32),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_metadata_matches_cpu(name):
    cpu, dev = _pair()
    v_cpu, v_dev = VIEWS[name](cpu), VIEWS[name](dev)
    assert v_dev.shape == v_cpu.shape
    assert v_dev.stride() == v_cpu.stride()
    assert v_dev.storage_offset() == v_cpu.storage_offset()
    assert v_dev.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    assert (v_dev._base is dev) == (v_cpu._base is cpu)
    assert_same(v_dev, v_cpu, atol=0, rtol=0)


def test_in_place_on_view_changes_base():
    x = torch.arange(6.0)
    d = x.to("pjrt")
    x.view(2, 3)[:, 1].add_(10)
    d.view(2, 3)[:, 1].add_(10)
    assert_same(d, x, atol=0, rtol=0)


def test_view_of_view_sees_writes_through_base():
    x, d = _pair((5, 5))
    vc, vd = x[1:4, 1:4].t(), d[1:4, 1:4].t()
    x.fill_(2.0)
    d.fill_(2.0)
    assert_same(vd, vc)
    x[2].mul_(3)
    d[2].mul_(3)
    assert_same(vd, vc)


INPLACE = [
    lambda v: v.add_(1.5),
    lambda v: v.mul_(-2),
    lambda v: v.zero_(),
    lambda v: v.fill_(3.0),
    lambda v: v.clamp_(-0.5, 0.5),
    lambda v: v.copy_(torch.ones(()).expand_as(v) * 7) if v.device.type == "cpu"
    else v.copy_(torch.ones(()).to(v.device).expand_as(v) * 7),
    lambda v: v.exp_() if v.is_floating_point() else v,
]

VIEW_CHAIN = [
    lambda t: t[1:],
    lambda t: t.t() if t.dim() == 2 else t,
    lambda t: t[:, ::2] if t.dim() == 2 else t[::2],
    lambda t: t.unsqueeze(0)[0],
    lambda t: t.diagonal() if t.dim() == 2 else t,
    lambda t: t.view(-1) if t.is_contiguous() else t,
    lambda t: t.narrow(0, 0, max(t.shape[0] - 1, 1)),
]


@pytest.mark.parametrize("seed", range(12))
def test_torture_random_view_chains_with_in_place_ops(seed):
    """Chains of views with in-place ops, checked against CPU after every step."""
    rng = random.Random(seed)
    base_cpu = torch.randn(7, 9, dtype=torch.float64)
    base_dev = base_cpu.to("pjrt")
    for _ in range(10):
        vc, vd = base_cpu, base_dev
        for _ in range(rng.randint(1, 4)):
            f = rng.choice(VIEW_CHAIN)
            vc, vd = f(vc), f(vd)
            assert vd.stride() == vc.stride() and vd.storage_offset() == vc.storage_offset()
        op = rng.choice(INPLACE)
        op(vc)
        op(vd)
        assert_same(base_dev, base_cpu, atol=1e-12, rtol=1e-12)
        assert_same(vd, vc, atol=1e-12, rtol=1e-12)


COPY_CASES = [
    ("cpu->pjrt", "cpu", "pjrt"),
    ("pjrt->cpu", "pjrt", "cpu"),
    ("pjrt->pjrt", "pjrt", "pjrt"),
    ("pjrt0->pjrt1", "pjrt:0", "pjrt:1"),
]


@pytest.mark.parametrize("name,src_dev,dst_dev", COPY_CASES)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float32, torch.int64),
                                    (torch.int32, torch.float64), (torch.bfloat16, torch.float32),
                                    (torch.bool, torch.float16)])
def test_copy_every_direction_into_non_contiguous_views(name, src_dev, dst_dev, dtypes):
    src_dtype, dst_dtype = dtypes
    src = (torch.randn(3, 4) * 5).to(src_dtype)
    expected = torch.zeros(4, 6, dtype=dst_dtype)
    expected[:3, 1::2].copy_(src[:, :3])
    dst = torch.zeros(4, 6, dtype=dst_dtype, device=dst_dev)
    dst[:3, 1::2].copy_(src.to(src_dev)[:, :3])
    torch.testing.assert_close(dst.cpu(), expected)


def test_copy_broadcasts_source():
    d = torch.zeros(3, 4, device="pjrt")
    d.copy_(torch.arange(4.0))
    torch.testing.assert_close(d.cpu(), torch.arange(4.0).expand(3, 4))


def test_conjugate_and_negative_views_read_and_write_through():
    """x.conj() of a complex tensor and imag of it are lazy (a bit, not a copy): every op
    that reads them, copies them or writes through them sees the conjugated values."""
    c = torch.randn(3, 4, dtype=torch.complex64)
    d = c.to("pjrt")
    assert d.conj().is_conj() and d.conj().imag.is_neg()
    assert_same(d.conj(), c.conj())
    assert_same(d.conj() * 2 + 1, c.conj() * 2 + 1)
    assert_same(d.conj() @ d.mT, c.conj() @ c.mT)  # mm takes conjugate inputs as they are
    assert_same(d.conj().imag * 1, c.conj().imag * 1)
    assert_same(torch._neg_view(d.real) + 0, torch._neg_view(c.real) + 0)
    c.conj().add_(1j)
    d.conj().add_(1j)
    assert_same(d, c)
    x = torch.randn(6)
    assert_same(torch.fft.ifft(x.to("pjrt")), torch.fft.ifft(x))  # conj(r2c) inside


def test_head_views_at_an_offset_read_and_write_in_place():
    """q, k and v of one projection are [B, H, T, E] views at offsets 0, D and 2D into
    a [B, T, 3D] buffer; the block that holds k or v, cut at its offset, runs past the
    buffer's end. They are read (and written) from the buffer without a padded copy."""
    from torch_pjrt.storage import views

    b, t, h, e = 2, 5, 3, 4
    qkv = torch.randn(b, t, 3 * h * e)
    dev = qkv.to("pjrt")
    for i in range(3):
        cpu_view = qkv[..., i * h * e:(i + 1) * h * e].view(b, t, h, e).transpose(1, 2)
        dev_view = dev[..., i * h * e:(i + 1) * h * e].view(b, t, h, e).transpose(1, 2)
        assert_same(dev_view * 1, cpu_view * 1)
        cpu_view.mul_(i + 2)
        dev_view.mul_(i + 2)
        assert_same(dev, qkv)
    # the plan for k: the whole buffer as [b, t, 3h, e] rows, k starting at coordinate h
    v = dev[..., h * e:2 * h * e].view(b, t, h, e).transpose(1, 2)
    order, block = views._block_plan(tuple(v.shape), v.stride())
    limits = (block[0],) + tuple(v.shape[i] for i in order[1:]) + (1,)
    assert views._block_start(jnp.zeros(dev.numel()), v.storage_offset(), block, limits) \
        == (0, (0, 0, h, 0, 0)[:len(block)])


def _index_put(e, dev):
    e.index_put_((torch.tensor([1], device=dev),), torch.tensor(2.0, device=dev))


def _index_put_2d(e, dev):
    e.index_put_((torch.tensor([0, 1], device=dev), torch.tensor([1, 0], device=dev)),
                 torch.tensor([[1.0, 1, 1], [2, 2, 2]], device=dev))


def _index_fill(e, dev):
    e.index_fill_(0, torch.tensor([1], device=dev), 2.0)


def _setitem(e, dev):
    e[torch.tensor([1, 3], device=dev)] = torch.tensor([[1.0, 2, 3], [7, 8, 9]], device=dev)


@pytest.mark.filterwarnings("ignore:Use of index")
@pytest.mark.parametrize("write,shape", [(_index_put, (2, 3)), (_index_put_2d, (2, 2, 3)),
                                         (_index_fill, (2, 3)), (_setitem, (4, 3))],
                         ids=["index_put_", "index_put_2d", "index_fill_", "setitem"])
def test_indexed_writes_into_an_expanded_tensor_reach_its_base(write, shape):
    """PyTorch allows index_put_ and index_fill_ into an expanded tensor (deprecated): it
    writes the indexed elements one after another, so the last one written reaches the
    shared memory. pjrt wrote the whole view back, copy 0 (unwritten) last: the write was
    lost, silently, until December 3."""
    results = []
    for dev in ("cpu", "pjrt"):
        x = torch.zeros(3, device=dev)
        write(x.expand(*shape), dev)
        results.append(x.cpu())
    assert torch.equal(results[1], results[0])
