"""Sorting, order statistics, searching and counting, differential against CPU."""

import pytest
import torch
from helpers import assert_same, compare, to_device
from opinfo_diff import check_samples, fallbacks_of, install_dynamic_kernels

NAN = float("nan")
SORTING_OPS = ("sort", "topk", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin",
               "searchsorted", "bucketize", "histc", "masked_scatter", "nonzero_static")

# Ops whose CPU kernel picks among equal elements in an unspecified order (std::sort,
# std::nth_element): values must match exactly; an index must point at an equal element.
# {op: (position of dim among the args after the input, default dim, position of keepdim)}
_SELECTIONS = {"sort": (0, -1, None), "topk": (1, -1, None), "kthvalue": (1, -1, 2),
               "median": (0, None, 1), "nanmedian": (0, None, 1), "mode": (0, -1, 1),
               "msort": (None, 0, None), "argsort": (0, -1, None)}


def _arg(sample, pos, name, default):
    if pos is not None and len(sample.args) > pos:
        return sample.args[pos]
    return sample.kwargs.get(name, default)


def _check_selection(op_name):
    dim_pos, dim_default, keep_pos = _SELECTIONS[op_name]

    def check(actual, expected, sample):
        if op_name == "argsort":  # indices only: they must sort the input the same way
            dim = _arg(sample, dim_pos, "dim", dim_default)
            x = sample.input.detach()
            assert actual.dtype == torch.long and actual.shape == expected.shape
            if x.dim():
                torch.testing.assert_close(x.gather(dim, actual.cpu()), x.gather(dim, expected),
                                           equal_nan=True, atol=0, rtol=0)
            return
        if isinstance(expected, torch.Tensor):  # a values-only overload
            assert_same(actual, expected)
            return
        values, indices = actual
        assert_same(values, expected[0])
        assert indices.dtype == torch.long and indices.shape == expected[1].shape
        dim = _arg(sample, dim_pos, "dim", dim_default)
        x = sample.input.detach()
        if dim is None or x.dim() == 0:
            return
        keepdim = _arg(sample, keep_pos, "keepdim", False) if keep_pos is not None else True
        idx = indices.cpu() if keepdim else indices.cpu().unsqueeze(dim)
        picked = x.gather(dim, idx)
        want = expected[0] if keepdim else expected[0].unsqueeze(dim)
        torch.testing.assert_close(picked, want, equal_nan=True, atol=0, rtol=0)

    return check


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("name", ["sort", "topk", "kthvalue", "median", "nanmedian", "mode",
                                  "msort", "argsort"])
def test_selection_opinfo(name, dtype):
    # Gradients follow the chosen index, which CPU picks arbitrarily among ties: checked
    # where ties are rare (float32 samples).
    grad = dtype == torch.float32
    assert check_samples(name, dtypes=(dtype,), grad=grad, check=_check_selection(name)) > 0
    assert not fallbacks_of(SORTING_OPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("name", ["cummax", "cummin", "searchsorted", "bucketize",
                                  "nonzero_static", "masked_scatter"])
def test_exact_opinfo(name, dtype):
    assert check_samples(name, dtypes=(dtype,)) > 0
    assert not fallbacks_of(SORTING_OPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_histc_opinfo(dtype):
    assert check_samples("histc", dtypes=(dtype,)) > 0
    assert not fallbacks_of(SORTING_OPS)


# ------------------------------------------------------------------ sort order
SPECIAL = torch.tensor([3.0, 1.0, 2.0, 1.0, NAN, 3.0, -0.0, 0.0, 1.0, NAN, float("inf"),
                        -float("inf"), -NAN])


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_largest_and_signed_zeros_tie(descending):
    out = compare(lambda x: torch.sort(x, descending=descending, stable=True), SPECIAL)
    # -0.0 and 0.0 keep their input order (the comparison does not see the sign bit).
    zeros = out.values.cpu() == 0
    assert torch.equal(out.indices.cpu()[zeros], torch.tensor([6, 7]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.uint8, torch.int32, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_dtypes(dtype, descending):
    x = torch.randint(-3, 4, (6, 33)).to(dtype)
    compare(lambda x: torch.sort(x, dim=1, descending=descending, stable=True), x)
    compare(lambda x: torch.argsort(x, dim=0, descending=descending, stable=True), x)


def test_sort_extreme_integers():
    x = torch.tensor([torch.iinfo(torch.int64).min, 0, torch.iinfo(torch.int64).max, -1, 1])
    compare(lambda x: torch.sort(x, descending=True), x)
    compare(lambda x: torch.sort(x), x)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,), (2, 1, 3)])
def test_sort_odd_shapes(shape):
    x = torch.randn(shape)
    compare(lambda x: torch.sort(x, stable=True), x)
    compare(lambda x: torch.sort(x, dim=0, stable=True), x)
    compare(lambda x: torch.cummax(x, 0), x)
    compare(lambda x: torch.cummin(x, -1), x)


def test_sort_out_and_values_overloads():
    x = torch.randn(4, 5)
    v, i = torch.empty(0), torch.empty(0, dtype=torch.long)
    dv, di = torch.empty(0, device="pjrt"), torch.empty(0, dtype=torch.long, device="pjrt")
    torch.sort(x, dim=1, stable=True, out=(v, i))
    torch.sort(to_device(x), dim=1, stable=True, out=(dv, di))
    assert_same((dv, di), (v, i))


# ------------------------------------------------------------------- topk
@pytest.mark.parametrize("largest", [True, False])
def test_topk_nan_and_ties_values(largest):
    out = torch.topk(to_device(SPECIAL), 6, largest=largest)
    expected = torch.topk(SPECIAL, 6, largest=largest)
    assert_same(out.values, expected.values)
    torch.testing.assert_close(SPECIAL[out.indices.cpu()], out.values.cpu(), equal_nan=True)


def test_topk_distinct_values_exact():
    x = torch.randperm(60).float().reshape(3, 4, 5)
    for dim in range(3):
        for k in (0, 1, 3):
            compare(lambda x, k=k, dim=dim: torch.topk(x, k, dim), x)
            compare(lambda x, k=k, dim=dim: torch.topk(x, k, dim, largest=False), x)
    compare(lambda x: torch.topk(x, 1), torch.tensor(2.5))


# -------------------------------------------------------- order statistics
def test_kthvalue_and_median_distinct_exact():
    x = torch.randperm(35).float().reshape(5, 7)
    for k in (1, 4, 5):
        compare(lambda x, k=k: torch.kthvalue(x, k, 0, keepdim=True), x)
    compare(lambda x: (torch.median(x), torch.median(x, 1), torch.nanmedian(x, 0)), x)


def test_median_nan():
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [4.0, 2.0, 1.0, 0.5], [NAN, NAN, NAN, NAN]])
    compare(lambda x: (torch.median(x, 1), torch.median(x)), x)
    compare(lambda x: (torch.nanmedian(x, 1).values, torch.nanmedian(x)), x)
    compare(lambda x: torch.nanmedian(x[:2], 1), x)


def test_median_empty_and_scalar():
    compare(lambda x: (torch.median(x), torch.nanmedian(x)), torch.empty(0))
    compare(lambda x: (torch.median(x, 0), torch.kthvalue(x, 1), torch.mode(x)), torch.tensor(3.0))


def test_mode_picks_smallest_most_frequent():
    x = torch.tensor([[1, 2, 2, 1, 3, 0], [5, 5, 5, 1, 1, 1], [4, 3, 2, 1, 0, 9]])
    out = torch.mode(to_device(x), 1)
    assert_same(out.values, torch.mode(x, 1).values)
    assert torch.equal(x.gather(1, out.indices.cpu()[:, None])[:, 0], out.values.cpu())
    compare(lambda x: torch.mode(x).values, torch.tensor([3.0, NAN, NAN, 1.0, 1.0]))


def test_cummax_cummin_nan_and_ties():
    x = torch.tensor([1.0, 3, 3, NAN, 2, NAN, 5, -0.0, 0.0])
    compare(lambda x: (torch.cummax(x, 0), torch.cummin(x, 0)), x)
    i = torch.tensor([[3, 1, 3, 0], [2, 2, 5, 5]])
    compare(lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), i)


def test_cummax_gradient():
    x = torch.randn(4, 6, requires_grad=True)
    g = torch.randn(4, 6)

    def fn(x):
        (torch.cummax(x, 1).values * g.to(x.device)).sum().backward()
        return x.grad

    compare(fn, x)


# ------------------------------------------------------------------ search
def test_searchsorted_matches_cpu_binary_search():
    b = torch.tensor([1.0, 3, 3, 5, 7, NAN])
    v = torch.tensor([[0.0, 3, 6, 9, NAN], [1, 2, 3, 8, -1]])
    for right in (False, True):
        compare(lambda b, v, r=right: torch.searchsorted(b, v, right=r), b, v)
        compare(lambda b, v, r=right: torch.bucketize(v, b, right=r, out_int32=True), b, v)
    compare(lambda b: torch.searchsorted(b, 3, side="right"), b)
    compare(lambda b: torch.bucketize(4, b), b)
    compare(lambda b: torch.searchsorted(b, 2.5), torch.tensor([1, 2, 3, 4]))
    unsorted = torch.tensor([5.0, 1, 4, 2, 3])
    compare(lambda b, v: torch.searchsorted(b, v), unsorted, torch.arange(7.0))


def test_searchsorted_batched_and_empty():
    b = torch.randn(3, 4, 9).sort(-1).values
    v = torch.randn(3, 4, 5)
    compare(lambda b, v: torch.searchsorted(b, v, right=True), b, v)
    compare(lambda b, v: torch.searchsorted(b, v), torch.empty(0), v)
    compare(lambda b, v: torch.searchsorted(b, v), b[0, 0], torch.empty(0, 2))


def test_searchsorted_sorter():
    s = torch.randn(3, 8)
    sorter = s.argsort(-1)
    compare(lambda s, v, o: torch.searchsorted(s, v, sorter=o), s, torch.randn(3, 4), sorter)
    compare(lambda s, v, o: torch.searchsorted(s, v, side="right", sorter=o),
            s[0], torch.randn(5), sorter[0])


# ------------------------------------------------------------------ counting
def test_histc_ranges():
    x = torch.randn(200)
    compare(lambda x: torch.histc(x), x)
    compare(lambda x: torch.histc(x, 13, -1.0, 1.0), x)
    compare(lambda x: torch.histc(x, 4, 0, 0), torch.full((5,), 2.0))  # one value: [1, 3]
    compare(lambda x: torch.histc(x, 5, 0, 4), torch.tensor([0.0, 1, 2, 3, 4, 4, NAN, 5, -1]))
    compare(lambda x: torch.histc(x, 3), torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_counts_as_cuda(dtype):
    """Integers: CUDA's kernel (the CPU's refuses them), bin (x - min) * bins // (max - min)
    in int64, the result in the input's dtype; transformers' MoE counts expert ids so."""
    ids = torch.tensor([3, 0, 1, 3, 2, 2, 3, 7, 0], dtype=dtype)
    got = torch.histc(ids.to("pjrt"), bins=4, min=0, max=3)
    assert got.dtype == dtype
    assert got.cpu().tolist() == [2, 1, 2, 3]
    assert torch.histc(ids.to("pjrt"), bins=3).cpu().tolist() == [5, 3, 1]  # range 0..7
    assert torch.histc(ids.to("pjrt"), bins=5, min=1, max=5).cpu().tolist() == [1, 2, 3, 0, 0]


def test_histc_non_finite_range_is_an_error():
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(to_device(torch.tensor([1.0, float("inf")]))).cpu()


def test_masked_scatter_broadcast_inplace_and_grad():
    x = torch.randn(3, 4)
    mask = torch.rand(4) > 0.5
    src = torch.randn(3, 4)
    compare(lambda x, m, s: x.masked_scatter(m, s), x, mask, src)
    compare(lambda x, m, s: x.clone().masked_scatter_(m, s), x, mask, src)
    compare(lambda x, m, s: x.masked_scatter(m, s), torch.tensor(1.0), torch.tensor(True),
            torch.tensor([5.0, 6.0]))
    compare(lambda x, m, s: x.masked_scatter(m, s), x, torch.zeros(3, 4, dtype=torch.bool),
            torch.empty(0))

    def grads(x, s):
        out = x.masked_scatter(mask.to(x.device), s)
        (out * torch.arange(12.0).reshape(3, 4).to(x.device)).sum().backward()
        return x.grad, s.grad

    compare(grads, x.requires_grad_(), src.requires_grad_())


def test_masked_scatter_short_source_is_an_error():
    x, m, s = to_device((torch.zeros(4), torch.ones(4, dtype=torch.bool), torch.ones(2)))
    with pytest.raises(RuntimeError, match="masked_scatter"):
        x.masked_scatter(m, s).cpu()


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int32, torch.int64])
def test_masked_select_refuses_a_mask_that_is_not_bool(mask_dtype):
    """As the CPU does (PyTorch's test_masked_select): pjrt read an int32 or int64 mask as
    indices (x[mask]) and a uint8 one as a mask."""
    x = torch.arange(6.0)
    mask = torch.tensor([1, 0, 1, 1, 0, 0], dtype=mask_dtype)
    for fn in (lambda x, m: x.masked_select(m), lambda x, m: torch.masked_select(x, m)):
        for args in ((x, mask), to_device((x, mask))):
            with pytest.raises(RuntimeError, match="expected BoolTensor for mask"):
                fn(*args)
        compare(fn, x, mask.bool())


def test_nonzero_static():
    x = torch.tensor([[0, 1, 0], [2, 0, 3]])
    for size in (0, 2, 3, 6):
        compare(lambda x, n=size: torch.nonzero_static(x, size=n), x)
        compare(lambda x, n=size: torch.nonzero_static(x, size=n, fill_value=7), x)
    compare(lambda x: torch.nonzero_static(x, size=2), torch.tensor(5))


# ------------------------------------------------- data-dependent output sizes
@pytest.fixture
def dynamic_kernels():
    install_dynamic_kernels()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("name", ["unique", "unique_consecutive"])
def test_unique_opinfo(name, dtype, dynamic_kernels):
    assert check_samples(name, dtypes=(dtype,)) > 0
    assert not fallbacks_of(["unique"])


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_bincount_opinfo(dtype, dynamic_kernels):
    assert check_samples("bincount", dtypes=(dtype,)) > 0
    assert not fallbacks_of(["bincount"])


def test_unique_nan_signed_zero_and_flags(dynamic_kernels):
    x = SPECIAL[:10]
    for ri in (False, True):
        for rc in (False, True):
            flags = {"return_inverse": ri, "return_counts": rc}
            compare(lambda x, f=flags: torch.unique(x, sorted=False, **f), x)
            compare(lambda x, f=flags: torch.unique_consecutive(x, **f), x)
    compare(lambda x: torch.ops.aten._unique(x, return_inverse=True), x)
    compare(torch.unique, torch.empty(0))
    compare(lambda x: torch.unique(x, return_inverse=True), torch.randint(0, 4, (3, 5)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_dim(dim, dynamic_kernels):
    x = torch.randint(0, 2, (6, 5, 2))
    compare(lambda x: torch.unique(x, dim=dim, return_inverse=True, return_counts=True), x)
    compare(lambda x: torch.unique(x.float(), dim=dim), x)
    compare(lambda x: torch.unique_consecutive(x, dim=dim, return_counts=True), x)
    compare(lambda x: torch.ops.aten.unique_dim(x, dim), x)


@pytest.mark.parametrize("x", [torch.tensor([1.0, 0.0, 2.0]), torch.ones(2, 1, 3),
                               torch.zeros(2, 3), torch.tensor(1.0), torch.tensor(0.0)],
                         ids=["1d", "3d", "none", "0d", "0d-zero"])
def test_nonzero_layout_is_column_major(x):
    """nonzero's result has the CPU's (and CUDA's) strides (1, count), not row-major ones
    (found by the differential fuzzer, tests/fuzz)."""
    cpu, dev = x.nonzero(), to_device(x).nonzero()
    assert dev.stride() == cpu.stride()
    assert_same(dev, cpu)
    assert torch.argwhere(to_device(x)).stride() == torch.argwhere(x).stride()


def test_bincount_weights_and_errors(dynamic_kernels):
    x = torch.tensor([1, 5, 2, 2, 0])
    compare(lambda x: (torch.bincount(x), torch.bincount(x, minlength=9)), x)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int64):
        compare(lambda x, w: torch.bincount(x, w), x, torch.arange(5).to(dtype))
    compare(lambda x: torch.bincount(x, minlength=3), torch.empty(0, dtype=torch.long))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(to_device(torch.tensor([1, -1])))


def test_every_eager_mode(eager_mode, dynamic_kernels):
    x = torch.randn(4, 9)
    compare(lambda x: (torch.sort(x, dim=1, descending=True, stable=True), torch.topk(x, 3),
                       torch.cummax(x, 0), torch.median(x, 1),
                       torch.searchsorted(torch.sort(x, stable=True).values, x[:, :2])), x)
    compare(lambda x: (torch.unique(x, return_inverse=True, return_counts=True),
                       torch.bincount(x.flatten()), torch.histc(x.float(), 5)),
            torch.randint(0, 6, (3, 7)))
    assert not fallbacks_of(SORTING_OPS + ("unique", "bincount"))
