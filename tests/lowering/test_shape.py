"""Shape ops that move data (padding, scatters into slices, windows, *_copy), against CPU."""

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu, assert_same, compare, float64, to_device
from opinfo_diff import check_samples, fallbacks_of, install_dynamic_kernels

SHAPE_OPS = ("pad", "flip", "roll", "tril", "triu", "repeat", "stack", "cat", "diag_embed",
             "scatter", "take", "put", "index_reduce", "_copy", "rot90", "block_diag",
             "chunk_cat", "im2col", "col2im", "shuffle", "unfold", "indices", "_backward")

OPINFO = [
    ("nn.functional.pad", "reflect"), ("nn.functional.pad", "replicate"),
    ("nn.functional.pad", "replicate_negative"), ("nn.functional.pad", "constant"),
    ("nn.functional.pad", "circular"), ("flip", ""), ("roll", ""), ("tril", ""), ("triu", ""),
    ("repeat", ""), ("stack", ""), ("cat", ""), ("diag_embed", ""), ("diagonal_scatter", ""),
    ("select_scatter", ""), ("slice_scatter", ""), ("as_strided_scatter", ""), ("take", ""),
    ("put", ""), ("narrow_copy", ""), ("rot90", ""), ("block_diag", ""), ("_chunk_cat", ""),
    ("expand_copy", ""), ("permute_copy", ""), ("view_copy", ""), ("unfold_copy", ""),
    ("split_with_sizes_copy", ""), ("squeeze_copy", ""), ("t_copy", ""), ("transpose_copy", ""),
    ("unbind_copy", ""), ("unsqueeze_copy", ""), ("diagonal_copy", ""), ("alias_copy", ""),
    ("nn.functional.unfold", ""), ("nn.functional.pixel_shuffle", ""),
    ("nn.functional.pixel_unshuffle", ""), ("nn.functional.channel_shuffle", ""),
    ("unfold", ""), ("diag", ""), ("kron", ""), ("take_along_dim", ""), ("fliplr", ""),
    ("flipud", ""), ("tile", ""),
]
_id = [f"{n}-{v}" if v else n for n, v in OPINFO]


@pytest.mark.parametrize("name,variant", OPINFO, ids=_id)
def test_opinfo_float_with_grad(name, variant):
    assert check_samples(name, variant, dtypes=(torch.float32,)) > 0
    assert not fallbacks_of(SHAPE_OPS)


@pytest.mark.parametrize("name,variant", [o for o in OPINFO if o[1] != "circular"], ids=[
    i for i, o in zip(_id, OPINFO) if o[1] != "circular"])
def test_opinfo_int64_and_bfloat16(name, variant):
    # (reflect/replicate padding and unfold are float-only on CPU; the sample then raises
    # on both devices, which the helper skips by dtype support.)
    from opinfo_diff import opinfo

    dtypes = [d for d in (torch.int64, torch.bfloat16) if d in opinfo(name, variant).dtypes]
    if not dtypes:
        pytest.skip("float-only op")
    assert check_samples(name, variant, dtypes=tuple(dtypes), grad=False) > 0
    assert not fallbacks_of(SHAPE_OPS)


@pytest.mark.parametrize("variant", ["mean", "prod", "amin", "amax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_index_reduce_opinfo(variant, dtype):
    # Gradients go through index_select of a 0-d input (indexing family); forward only here.
    assert check_samples("index_reduce", variant, dtypes=(dtype,), grad=False) > 0
    assert not fallbacks_of(["index_reduce"])


# ------------------------------------------------------------------ padding
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", [
    ((2, 7), (2, 3)), ((1, 2, 7), (3, 1)), ((2, 5, 6), (1, 2, 3, 0)),
    ((1, 2, 5, 6), (0, 2, 4, 1)), ((2, 3, 4, 5), (1, 1, 2, 2, 3, 0)),
    ((1, 2, 3, 4, 5), (2, 1, 0, 3, 1, 2)), ((2, 9), (-2, 3)), ((1, 2, 8), (4, -3)),
])
def test_reflect_replicate_pad_and_backward(mode, shape, pad):
    if mode == "reflect" and any(p >= s for p, s in zip(pad[::2], shape[::-1])):
        pytest.skip("reflection padding must be smaller than the dim")
    x = torch.randn(shape, requires_grad=True)
    g = torch.randn(F.pad(x.detach(), pad, mode=mode).shape)

    def fn(x):
        y = F.pad(x, pad, mode=mode)
        (gx,) = torch.autograd.grad(y, x, g.to(x.device))
        return y, gx

    compare(fn, x)
    assert not fallbacks_of(["pad"])


@pytest.mark.parametrize("eager", ["strict", "fused"])
@pytest.mark.parametrize("kind", ["reflection", "replication"])
def test_reflect_replicate_pad_check_the_input_rank(eager, kind):
    # the meta kernels of the 2-d and 3-d pads check nothing: a 5-d input to
    # reflection_pad2d failed in the lowering with a broadcasting ValueError
    import torch_pjrt

    cases = [(1, (3, 3, 10, 10)), (2, (3, 3, 10, 10, 10)), (3, (3, 3, 10, 10, 10, 10)),
             (2, (43, 0, 10, 10)), (2, (10, 10)), (3, (2, 3, 0, 4, 4))]
    with torch_pjrt.set_eager_mode(eager):
        for n, shape in cases:
            op = getattr(torch.ops.aten, f"{kind}_pad{n}d")
            with pytest.raises(RuntimeError) as cpu_error:
                op(torch.randn(shape), [2] * (2 * n))
            expected = re.escape(str(cpu_error.value).split(" (batch mode)")[0])
            with pytest.raises(RuntimeError, match=expected):
                op(torch.randn(shape, device="pjrt"), [2] * (2 * n))
        empty_batch = torch.randn(0, 3, 5, 5)
        assert_same(getattr(torch.ops.aten, f"{kind}_pad2d")(empty_batch.to("pjrt"), [2] * 4),
                    getattr(torch.ops.aten, f"{kind}_pad2d")(empty_batch, [2] * 4))


# -------------------------------------------------- scatters and backwards
def test_select_slice_diagonal_backward():
    x = torch.randn(4, 5, 6, requires_grad=True)

    def fn(x):
        parts = [x[1], x[:, -2], x[..., 1:5:2], x[::3, 2:], x.diagonal(1, 0, 2),
                 x.diagonal(-1, 1, 2), x[:, :, 1:4]]
        loss = sum((p * torch.arange(p.numel(), dtype=p.dtype, device=p.device)
                    .reshape(p.shape)).sum() for p in parts)
        return torch.autograd.grad(loss, x)[0]

    compare(fn, x)
    assert not fallbacks_of(["_backward", "scatter"])


def test_scatter_into_slices():
    x = torch.zeros(4, 6)
    compare(lambda x, s: torch.select_scatter(x, s, 1, -1), x, torch.randn(4))
    compare(lambda x, s: torch.slice_scatter(x, s, 1, 1, None, 2), x, torch.randn(4, 3))
    compare(lambda x, s: torch.slice_scatter(x, s, 0, -3, 100), x, torch.randn(3, 6))
    compare(lambda x, s: torch.diagonal_scatter(x, s, 2), x, torch.randn(4))
    compare(lambda x, s: torch.diagonal_scatter(x, s, -3), x, torch.randn(1))
    compare(lambda x, s: torch.diagonal_scatter(x, s, 7), x, torch.randn(0))


def test_diag_embed_offsets_and_dims():
    x = torch.randn(2, 3, 4)
    for offset in (-2, 0, 1):
        compare(lambda x, o=offset: torch.diag_embed(x, o, 0, 2), x)
        compare(lambda x, o=offset: torch.diag_embed(x, o, -1, 1), x)


def test_take_and_put():
    x = torch.randn(3, 4)
    idx = torch.tensor([[0, -1], [5, 11]])
    compare(torch.take, x, idx)
    compare(lambda x, i, s: x.clone().put_(i, s), x, idx, torch.randn(2, 2))
    compare(lambda x, i, s: x.put(i, s, accumulate=True), x, torch.tensor([1, 1, 2]),
            torch.ones(3))
    with pytest.raises(IndexError):
        torch.take(to_device(x), to_device(torch.tensor([12]))).cpu()


# ----------------------------------------------------------- windows, blocks
@pytest.mark.parametrize("kernel,dilation,padding,stride", [
    ((2, 2), (1, 1), (0, 0), (1, 1)), ((3, 2), (1, 2), (1, 0), (2, 1)),
    ((2, 3), (2, 1), (2, 1), (1, 3)),
])
def test_unfold_fold(kernel, dilation, padding, stride):
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    kw = {"kernel_size": kernel, "dilation": dilation, "padding": padding, "stride": stride}

    def fn(x):
        cols = F.unfold(x, **kw)
        back = F.fold(cols, x.shape[-2:], **kw)
        return cols, back, torch.autograd.grad(back.sum(), x)[0]

    # fold adds overlapping patches: as accurate as the CPU against float64
    assert_as_accurate_as_cpu(fn(to_device(x)), fn(x), fn(float64(x)))
    compare(lambda x: F.fold(F.unfold(x, **kw), x.shape[-2:], **kw), x[0].detach())
    assert not fallbacks_of(["im2col", "col2im"])


def test_tensor_unfold_backward():
    x = torch.randn(5, 10, 3, requires_grad=True)
    for dim, size, step in [(1, 3, 2), (1, 4, 4), (0, 2, 1), (2, 3, 1), (1, 2, 5)]:
        compare(lambda x, a=(dim, size, step): torch.autograd.grad(
            (x.unfold(*a) ** 2).sum(), x)[0], x)
    assert not fallbacks_of(["unfold"])


def test_pixel_and_channel_shuffle():
    x = torch.randn(2, 3, 8, 4, 6)
    compare(lambda x: F.pixel_shuffle(x, 2), x.reshape(2, 12, 8, 6)[:, :, :, :])
    compare(lambda x: F.pixel_unshuffle(x, 2), x[0])
    compare(lambda x: F.channel_shuffle(x, 3), x.reshape(2, 6, 4, 4, 6))
    compare(lambda x: F.pixel_shuffle(x, 3), torch.randn(9, 2, 1))


def test_tril_triu_indices():
    for r, c, o in [(3, 3, 0), (4, 3, 1), (3, 5, -2), (0, 3, 0), (3, 0, 1), (5, 5, 10),
                    (5, 5, -10)]:
        for fn in (torch.tril_indices, torch.triu_indices):
            actual = fn(r, c, o, device="pjrt")
            assert actual.device.type == "pjrt"
            assert torch.equal(actual.cpu(), fn(r, c, o))
    assert torch.tril_indices(3, 3, dtype=torch.int32, device="pjrt").dtype == torch.int32


def test_copies_of_views():
    x = torch.randn(3, 4, 5)
    compare(lambda x: torch.split_with_sizes_copy(x, [1, 3, 1], dim=2), x)
    compare(lambda x: torch.split_copy(x, 2, dim=1), x)
    compare(lambda x: torch.unbind_copy(x, 1), x)
    compare(lambda x: (torch.expand_copy(x[:, :1], (2, 3, 4, 5)), torch.view_copy(x, (-1, 10)),
                       torch.permute_copy(x, (2, 0, 1)), torch.squeeze_copy(x[:, :1], 1),
                       torch.narrow_copy(x, 2, -2, 2), torch.diagonal_copy(x, -1, 2, 0),
                       torch.t_copy(x[0]), torch.unfold_copy(x, 2, 2, 2)), x)
    compare(lambda x: (torch.select_copy(x, 1, -1), torch.slice_copy(x, 2, 1, None, 2),
                       torch.detach_copy(x), torch.alias_copy(x),
                       torch.squeeze_copy(x[:1, :, :1], (0, 2)), torch.transpose_copy(x, 0, 2),
                       torch.unsqueeze_copy(x, -1)), x)
    assert not fallbacks_of(["_copy"])


def test_split_with_sizes_copy_out_into_views():
    """FSDP2 copies an all-gathered buffer out into views of its parameters."""
    src = torch.randn(2, 12)

    def fn(src):
        dest = torch.zeros(2, 20, device=src.device)
        outs = [dest[:, :3], dest[:, 5:10], dest[:, 16:20]]
        torch.split_with_sizes_copy(src, [3, 5, 4], dim=1, out=outs)
        return dest

    compare(fn, src)


def test_chunk_cat():
    ts = [torch.randn(3, 5), torch.randn(3, 2), torch.randn(3, 7, 2)]
    compare(lambda *t: torch._chunk_cat(list(t[:2]), 1, 3), *ts)
    compare(lambda *t: torch._chunk_cat([t[0], t[2]], 1, 2), *ts)
    compare(lambda *t: torch._chunk_cat([t[0]], 0, 4), *ts)


def test_empty_and_zero_dim():
    e = torch.randn(0, 3)
    compare(lambda x: (torch.flip(x, [0]), torch.roll(x, 1, 1), torch.tril(x), x.repeat(2, 1),
                       torch.diag_embed(x), torch.rot90(x)), e)
    s = torch.tensor(2.5)
    compare(lambda x: (torch.flip(x, []), torch.roll(x, 3), x.repeat(2, 3),
                       torch.take(x, torch.tensor([0, 0], device=x.device))), s)


# ------------------------------------------- repeat_interleave (dynamic length)
@pytest.fixture
def dynamic_kernels():
    install_dynamic_kernels()


def test_repeat_interleave_opinfo(dynamic_kernels):
    assert check_samples("repeat_interleave", dtypes=(torch.float32, torch.int64)) > 0
    assert not fallbacks_of(["repeat_interleave"])


def test_repeat_interleave_tensor(dynamic_kernels):
    r = torch.tensor([2, 0, 3, 1])
    compare(torch.repeat_interleave, r)
    compare(torch.repeat_interleave, r.int())
    compare(lambda r: torch.repeat_interleave(r, output_size=6), r)
    compare(lambda x, r: torch.repeat_interleave(x, r, dim=0), torch.randn(4, 2), r)
    compare(lambda x, r: torch.repeat_interleave(x, r, dim=1, output_size=6),
            torch.randn(2, 4), r)
    compare(torch.repeat_interleave, torch.empty(0, dtype=torch.long))
    with pytest.raises(RuntimeError, match="negative"):
        torch.repeat_interleave(to_device(torch.tensor([1, -1])))
    with pytest.raises(RuntimeError, match="size"):
        torch.repeat_interleave(to_device(r), output_size=4).cpu()
    assert not fallbacks_of(["repeat_interleave"])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.bool, torch.float32])
def test_repeat_interleave_takes_the_repeats_dtypes_the_cpu_takes(dynamic_kernels, dtype):
    """torch 2.13's CPU takes int32 and int64 repeats, 2.14's every integer dtype: pjrt
    computes what this torch's CPU computes and refuses what it refuses, with its error."""
    r = torch.tensor([2, 0, 3, 1]).to(dtype)
    try:
        torch.repeat_interleave(r)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e), match=re.escape(str(e))):
            torch.repeat_interleave(to_device(r)).cpu()
        return
    compare(torch.repeat_interleave, r)
    compare(lambda x, r: torch.repeat_interleave(x, r, dim=0), torch.randn(4, 2), r)


def test_repeat_interleave_compiles_per_bucket(dynamic_kernels, monkeypatch):
    from torch_pjrt.eager import tiers

    # (each flush runs its graph's own program: tiering's first runs compile op programs,
    # then the fused one, docs/compile-cost.md; the buckets are what this test counts)
    monkeypatch.setattr(tiers, "enabled", False)

    from torch_pjrt.runtime import watch

    for n in (5, 6, 7, 8):
        out = torch.repeat_interleave(to_device(torch.tensor([n - 1, 1])))
        assert_same(out, torch.repeat_interleave(torch.tensor([n - 1, 1])))
    # One program of the op for lengths 5..8 (a power-of-two bucket); reading each result
    # (a copy of its first n elements) is a program per length, as any read of n elements.
    kernels = [p for p in watch.programs() if p.kind == "op"
               and "repeat_interleave_padded.default(int64[2])" in p.title]
    assert len(kernels) == 1 and kernels[0].compiles + kernels[0].loads == 1, kernels


def test_every_eager_mode(eager_mode, dynamic_kernels):
    x = torch.randn(2, 3, 6, 5, requires_grad=True)

    def fn(x):
        y = F.pad(x, (1, 2, 2, 1), mode="reflect") + 1
        z = F.fold(F.unfold(y, 2), y.shape[-2:], 2)
        w = torch.cat([z.flatten(), x.select(1, 0).flatten(), torch.diag_embed(x[0, 0]).flatten()])
        grad = torch.autograd.grad(w.square().sum(), x)[0]
        return w, grad, torch.repeat_interleave(torch.tensor([1, 0, 2], device=x.device))

    assert_as_accurate_as_cpu(fn(to_device(x)), fn(x), fn(float64(x)))
    assert not fallbacks_of(SHAPE_OPS)
