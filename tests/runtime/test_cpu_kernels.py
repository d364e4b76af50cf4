"""On XLA:CPU, float32 products run MKL's GEMM, and layer norm, GELU and attention
ATen's kernels (runtime/cpu_kernels.py), with PyTorch's results."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import (
    assert_as_accurate_as_cpu,
    compare_products,
    float64,
    outputs_and_grads,
    pytest_without_cpu_kernels,
    to_device,
)

import torch_pjrt
from torch_pjrt.runtime import cpu_kernels

pytestmark = pytest.mark.usefixtures("eager_mode")

# (a, b) of every transpose combination, stacked and not, with sizes that are not
# multiples of the blocks the GEMM cuts them into.
_PRODUCTS = [
    ((67, 131), (131, 97), lambda a, b: a @ b),
    ((131, 67), (131, 97), lambda a, b: a.t() @ b),
    ((67, 131), (97, 131), lambda a, b: a @ b.t()),
    ((131, 67), (97, 131), lambda a, b: a.t() @ b.t()),
    ((5, 3, 70, 66), (5, 3, 66, 72), lambda a, b: a @ b),
    ((5, 3, 66, 70), (5, 3, 72, 66), lambda a, b: a.transpose(-1, -2) @ b.mT),
    ((6, 65, 80), (6, 65, 90), lambda a, b: torch.bmm(a.transpose(1, 2), b)),
    ((300, 64), (64, 1), lambda a, b: a @ b),  # a column: one block
]


@pytest.mark.parametrize("case", range(len(_PRODUCTS)))
def test_products_match_cpu(case):
    sa, sb, fn = _PRODUCTS[case]
    a, b = torch.randn(sa), torch.randn(sb)
    compare_products(fn, a, b)


def _grads_match(fn, *tensors) -> None:
    """fn's output and input gradients on pjrt are as accurate as the CPU's, both against
    fn run in float64 (tests/tolerance.py): MKL and oneDNN pick their kernels by the
    processor, so the CPU's own rounding differs from machine to machine."""
    expected = outputs_and_grads(fn, *tensors)
    actual = outputs_and_grads(fn, *to_device(list(tensors)))
    assert_as_accurate_as_cpu(actual, expected, outputs_and_grads(fn, *float64(tensors)))


def test_linear_and_attention_gradients_match_cpu():
    x, w, bias = torch.randn(4, 33, 96), torch.randn(80, 96), torch.randn(80)
    q, k, v = (torch.randn(2, 4, 72, 64) for _ in range(3))

    def fn(x, w, bias, q, k, v):
        h = torch.nn.functional.linear(x, w, bias)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return h.sum() + (att * att).sum()

    _grads_match(fn, x, w, bias, q, k, v)


def test_independent_kernel_calls_in_one_program_match_cpu():
    """Kernel calls that XLA runs at once share one queue of blocks (run_blocks in
    native/cpu_kernels.cpp): a program of independent products, layer norms and GELUs,
    each cut into blocks, whose results would differ if a block ran with another call's
    operands or a call returned before its blocks had run."""
    xs = [torch.randn(400 + 16 * i, 96) for i in range(6)]
    w, gamma, beta = torch.randn(160, 96), torch.randn(160), torch.randn(160)

    def fn(w, gamma, beta, *xs):
        outs = []
        for x in xs:
            h = torch.nn.functional.linear(x, w)
            h = torch.nn.functional.layer_norm(h, (160,), gamma, beta)
            outs.append(torch.nn.functional.gelu(h))
        return outs

    inputs = (w, gamma, beta, *xs)
    assert_as_accurate_as_cpu(fn(*to_device(inputs)), fn(*inputs), fn(*float64(inputs)))


@pytest.fixture
def mode_offset(eager_mode, monkeypatch, tmp_path) -> int:
    """For tests that count kernel calls while programs are traced: a fresh compile
    cache (programs traced, not loaded), skipped where the kernels are off, and a size
    offset per mode so that no mode reuses another's already compiled programs."""
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    if not cpu_kernels.available():
        pytest.skip("the kernels are used on the cpu platform with an MKL build of torch")
    return ("strict", "fused", "debug").index(eager_mode)


def test_products_call_the_gemm(mode_offset):
    n = 91 + mode_offset
    x = torch.randn(n, 77, device="pjrt", requires_grad=True)
    w = torch.randn(83, 77, device="pjrt", requires_grad=True)
    out = torch.nn.functional.linear(x, w)  # kept: fused mode drops a dead forward
    out.backward(torch.randn(n, 83, device="pjrt"))
    torch.pjrt.synchronize()
    traced = torch_pjrt.counters.value("cpu_gemm_traced")
    assert traced >= 3  # forward, input gradient, weight gradient
    # w.t() in the forward and the output gradient's transpose in the weight gradient
    assert torch_pjrt.counters.value("cpu_gemm_folded_transposes") >= 2
    del out


@pytest.mark.parametrize("shape, normalized, affine", [
    ((4, 37, 96), (96,), "both"),
    ((6, 5, 8, 12), (8, 12), "both"),  # two normalized dimensions
    ((50, 64), (64,), "weight"),  # no bias: the backward's kernel, the forward's own
    ((3, 40), (40,), "none"),  # no weight: XLA's own lowering
])
def test_layer_norm_matches_cpu(shape, normalized, affine):
    x = torch.randn(shape) * 3 + 2
    w = torch.randn(normalized) if affine != "none" else None
    b = torch.randn(normalized) if affine == "both" else None

    def fn(x, *params):
        wb = dict(zip(("weight", "bias"), params))
        return torch.nn.functional.layer_norm(x, normalized, eps=1e-5, **wb)

    params = [p for p in (w, b) if p is not None]
    _grads_match(fn, x, *params)


def test_layer_norm_calls_the_kernels(mode_offset):
    n = 70 + mode_offset
    x = torch.randn(n, 48, device="pjrt", requires_grad=True)
    ln = torch.nn.LayerNorm(48).to("pjrt")
    out = ln(x)
    out.backward(torch.randn_like(out))
    torch.pjrt.synchronize()
    assert torch_pjrt.counters.value("cpu_layer_norm_traced") >= 2  # forward, backward
    del out


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_cpu(approximate):
    x = torch.randn(40, 1000) * 4  # over the kernel's size floor
    fn = lambda x: torch.nn.functional.gelu(x, approximate=approximate)  # noqa: E731
    _grads_match(fn, x)


def test_gelu_calls_the_kernel(mode_offset):
    n = 130 + mode_offset
    x = torch.randn(n, 256, device="pjrt", requires_grad=True)
    out = torch.nn.functional.gelu(x)
    out.backward(torch.randn_like(out))
    torch.pjrt.synchronize()
    assert torch_pjrt.counters.value("cpu_gelu_traced") >= 2  # forward, backward
    del out


# (batch, query heads, key heads, query length, key length, head dim, causal, scale):
# q, k, v are made as transposes of [B, L, H, E] (a transformer's layout) and as
# contiguous [B, H, L, E] tensors.
_ATTENTION = [
    (3, 4, 4, 40, 40, 16, True, None),
    (1, 3, 3, 10, 7, 8, False, 0.3),  # a batch of one: blocks of heads
    (2, 3, 3, 7, 12, 8, True, None),  # more keys than queries
    (2, 4, 2, 9, 9, 8, True, None),  # grouped queries
]


@pytest.mark.parametrize("case", range(len(_ATTENTION)))
@pytest.mark.parametrize("layout", ["blhe", "bhle"])
def test_attention_matches_cpu(case, layout):
    b, hq, hk, lq, s, e, causal, scale = _ATTENTION[case]

    def make(h, length):
        if layout == "blhe":
            return torch.randn(b, length, h, e).transpose(1, 2)
        return torch.randn(b, h, length, e)

    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hk)

    _grads_match(fn, make(hq, lq), make(hk, s), make(hk, s))


def test_attention_calls_the_kernels(mode_offset):
    q, k, v = (torch.randn(2, 40 + mode_offset, 4, 16, device="pjrt").transpose(1, 2)
               .requires_grad_() for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.randn_like(out))
    torch.pjrt.synchronize()
    assert torch_pjrt.counters.value("cpu_attention_traced") >= 2  # forward, backward
    del out


_OFF = r"""
import torch, torch_pjrt
from torch_pjrt.runtime import cpu_kernels
a, b = torch.randn(100, 90), torch.randn(90, 80)
# tests/tolerance.py's sum_bound: both sides round each of 90 additions and the result
bound = 2 * (90 + 1) * 2.0 ** -24 * (a.abs() @ b.abs())
ok = bool((((a.to("pjrt") @ b.to("pjrt")).cpu() - a @ b).abs() <= bound).all())
print(cpu_kernels.available(), ok)
"""


def test_opt_out(eager_mode):
    if eager_mode != "strict":
        pytest.skip("one subprocess is enough")
    env = {**os.environ, "TORCH_PJRT_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", _OFF], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    assert out[-2:] == ["False", "True"]


def test_pure_xla_paths_too(eager_mode):
    """Every comparison with PyTorch above, run again with TORCH_PJRT_CPU_KERNELS=0: the
    lowerings' pure-XLA paths (what GPUs and TPUs run) stay tested on the CPU."""
    if eager_mode != "strict":
        pytest.skip("one subprocess runs them in every mode")
    pytest_without_cpu_kernels(__file__, "match_cpu and not pure_xla")


# ------------------------------------------------------------------ paged attention
def _paged_reference(query, cache, table, starts, lens, scale, max_query_len):
    """Causal attention of each request's rows over its pages, in float64 (the kernel's
    contract: runtime/cpu_kernels.paged_attention)."""
    block_size, kv_heads = cache.shape[1], cache.shape[3]
    group = query.shape[1] // kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    for r in range(table.shape[0]):
        lo, hi = int(starts[r]), int(starts[r + 1])
        rows = min(hi - lo, max_query_len)
        for i in range(rows):
            pos = int(lens[r]) - (hi - lo) + i
            keys = [cache[table[r, j // block_size], j % block_size] for j in range(pos + 1)]
            kv = torch.stack(keys).double()  # [n, 2, kv_heads, d]
            k = kv[:, 0].repeat_interleave(group, dim=1)
            v = kv[:, 1].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,khd->hk", query[lo + i].double(), k) * scale
            out[lo + i] = torch.einsum("hk,khd->hd", scores.softmax(-1), v)
    return out


@pytest.mark.parametrize("max_query_len", [1, 64])
def test_paged_attention_matches_reference(eager_mode, max_query_len):
    """Requests of 37 and 20 query rows (prefill, a chunk after 9 cached: several tiles of
    16 rows), a decode of 1 after 30, a padding request; grouped heads (4 over 2). With
    max_query_len 1, a decode step's contract: each request's first row only."""
    if eager_mode != "strict":
        pytest.skip("a JAX-level kernel: one mode is enough")
    if not cpu_kernels.available():
        pytest.skip("the kernels are used on the cpu platform with an MKL build of torch")
    import jax
    import jax.numpy as jnp

    g = torch.Generator().manual_seed(0)
    block, heads, kv_heads, d = 4, 4, 2, 8
    starts = torch.tensor([0, 37, 57, 58, 58], dtype=torch.int32)
    lens = torch.tensor([37, 29, 31, 0], dtype=torch.int32)
    pages = [list(range(1, 11)), list(range(11, 19)) + [0, 0],
             list(range(19, 27)) + [0, 0], [0] * 10]
    table = torch.tensor(pages, dtype=torch.int32)
    cache = torch.randn(32, block, 2, kv_heads, d, generator=g)
    query = torch.randn(64, heads, d, generator=g)
    want = _paged_reference(query, cache, table, starts, lens, 0.3, max_query_len)
    before = torch_pjrt.counters.value("cpu_paged_attention_traced")
    fn = jax.jit(lambda *a: cpu_kernels.paged_attention(*a, 0.3, max_query_len))
    got = fn(*(jnp.asarray(t.numpy()) for t in (query, cache, table, starts, lens)))
    assert torch_pjrt.counters.value("cpu_paged_attention_traced") == before + 1
    torch.testing.assert_close(torch.from_numpy(jax.device_get(got).copy()).double(), want,
                               rtol=1e-5, atol=1e-5)
    assert want[58:].abs().sum() == 0  # rows no request owns are zeros
