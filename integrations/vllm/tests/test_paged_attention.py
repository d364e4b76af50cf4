"""The paged KV cache's operators on pjrt against their PyTorch bodies on the CPU: on
XLA:CPU with the shim's paged attention kernel, and (test_pure_xla_path_too) again with
TORCH_PJRT_CPU_KERNELS=0, the pure-XLA form that other devices run."""

import os
import subprocess
import sys

import pytest
import torch
from torch_pjrt_vllm import paged_attention  # noqa: F401 - registers the operators

import torch_pjrt
from torch_pjrt.runtime import cpu_kernels

BLOCK, BLOCKS, KV_HEADS, HEADS, D = 4, 16, 2, 4, 8


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    # three requests: a prefill of 5 rows (no history), a decode of 1 row (10 cached), a
    # chunk of 3 rows after 4 cached; then a padding request; 16 rows, 9 real
    q_lens, seq_lens = [5, 1, 3, 0], [5, 11, 7, 0]
    qsl = torch.tensor([0, 5, 6, 9, 9], dtype=torch.int32)
    block_table = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0], [6, 7, 0, 0], [0, 0, 0, 0]],
                               dtype=torch.int32)
    cache = torch.randn(BLOCKS, BLOCK, 2, KV_HEADS, D, generator=g)
    query = torch.randn(16, HEADS, D, generator=g)
    slots = torch.full((16,), -1, dtype=torch.int32)
    row = 0
    for r, (ql, sl) in enumerate(zip(q_lens, seq_lens)):
        for p in range(sl - ql, sl):
            slots[row] = block_table[r, p // BLOCK] * BLOCK + p % BLOCK
            row += 1
    key = torch.randn(16, KV_HEADS, D, generator=g)
    value = torch.randn(16, KV_HEADS, D, generator=g)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return cache, key, value, slots, query, block_table, qsl, lens


@pytest.mark.parametrize("mode", ["strict", "fused", "compile"])
def test_write_then_attend_equals_cpu(mode):
    cache, key, value, slots, query, table, qsl, lens = _case()
    ops = torch.ops.torch_pjrt_vllm

    def step(cache, key, value, slots, query, table, qsl, lens):
        ops.write_kv(cache, key, value, slots)
        return ops.ragged_paged_attention(query, cache, table, qsl, lens, 0.3, 16)

    want_cache = cache.clone()
    want = step(want_cache, key, value, slots, query, table, qsl, lens)
    args = [t.to("pjrt") for t in (cache, key, value, slots, query, table, qsl, lens)]
    fn = torch.compile(step, backend="pjrt", fullgraph=True) if mode == "compile" else step
    with torch_pjrt.set_eager_mode("fused" if mode == "compile" else mode):
        got = fn(*args)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(args[0].cpu(), want_cache)
    assert want[9:].abs().sum() == 0  # rows no request owns


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_decode_step_with_cut_table_equals_cpu(mode):
    # a decode step: one row a request, the table cut to the pages the longest request spans
    cache, _, _, _, _, _, _, _ = _case(1)
    g = torch.Generator().manual_seed(2)
    query = torch.randn(16, HEADS, D, generator=g)
    qsl = torch.tensor([0, 1, 2, 3, 3], dtype=torch.int32)
    lens = torch.tensor([3, 8, 5, 0], dtype=torch.int32)
    table = torch.tensor([[1, 2], [3, 4], [6, 7], [0, 0]], dtype=torch.int32)
    ops = torch.ops.torch_pjrt_vllm
    want = ops.ragged_paged_attention(query, cache, table, qsl, lens, 0.3, 1)
    with torch_pjrt.set_eager_mode(mode):
        got = ops.ragged_paged_attention(*(t.to("pjrt") for t in (query, cache, table, qsl,
                                                                   lens)), 0.3, 1)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_requests_of_many_query_blocks_equal_cpu(mode):
    # a prefill of 37 rows and a chunk of 20 rows after 9 cached span several query blocks
    # (paged_attention.QUERY_BLOCK rows each), beside a decode and a padding request
    g = torch.Generator().manual_seed(3)
    q_lens, seq_lens = [37, 20, 1, 0], [37, 29, 31, 0]
    qsl = torch.tensor([0, 37, 57, 58, 58], dtype=torch.int32)
    pages = [list(range(1, 11)), list(range(11, 19)) + [0, 0], list(range(19, 27)) + [0, 0],
             [0] * 10]
    table = torch.tensor(pages, dtype=torch.int32)
    cache = torch.randn(32, BLOCK, 2, KV_HEADS, D, generator=g)
    query = torch.randn(64, HEADS, D, generator=g)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    assert sum(q_lens) > 3 * paged_attention.QUERY_BLOCK
    ops = torch.ops.torch_pjrt_vllm
    want = ops.ragged_paged_attention(query, cache, table, qsl, lens, 0.3, 64)
    with torch_pjrt.set_eager_mode(mode):
        got = ops.ragged_paged_attention(*(t.to("pjrt") for t in (query, cache, table, qsl,
                                                                   lens)), 0.3, 64)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert want[58:].abs().sum() == 0 and want[:58].abs().sum() > 0


def test_rows_past_the_limit_raise_on_cpu():
    cache, key, value, slots, query, table, qsl, lens = _case()
    with pytest.raises(ValueError, match="query rows"):
        torch.ops.torch_pjrt_vllm.ragged_paged_attention(query, cache, table, qsl, lens, 0.3, 1)


def test_float32_attention_takes_the_kernel_on_xla_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))  # traced, not loaded
    if not cpu_kernels.available():
        pytest.skip("TORCH_PJRT_CPU_KERNELS=0, or no kernels in this build")
    before = torch_pjrt.counters.value("cpu_paged_attention_traced")
    # new shapes (a program not compiled yet in this process): traced again
    cache = torch.randn(8, BLOCK, 2, KV_HEADS, D)
    query = torch.randn(3, HEADS, D)
    table = torch.tensor([[1, 2], [3, 0], [4, 5]], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    lens = torch.tensor([6, 2, 8], dtype=torch.int32)
    ops = torch.ops.torch_pjrt_vllm
    want = ops.ragged_paged_attention(query, cache, table, qsl, lens, 0.5, 1)
    with torch_pjrt.set_eager_mode("strict"):
        got = ops.ragged_paged_attention(*(t.to("pjrt") for t in (query, cache, table, qsl,
                                                                   lens)), 0.5, 1)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch_pjrt.counters.value("cpu_paged_attention_traced") > before


def test_pure_xla_path_too():
    """The comparisons above again with TORCH_PJRT_CPU_KERNELS=0."""
    if not cpu_kernels.available():
        pytest.skip("this run is the pure-XLA one")
    env = {**os.environ, "TORCH_PJRT_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p",
                          "no:cacheprovider", __file__, "-k", "cpu and not kernel and not pure"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "8 passed" in out.stdout, out.stdout[-3000:]
