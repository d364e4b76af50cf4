"""The vLLM plugin's ragged paged attention on XLA:CPU: the native kernel against the
pure-JAX form, side by side in one process, on decode steps and prefills.

Runs in the vLLM environment (docs/serving.md):
    .venv-vllm/bin/python bench/paged_attention.py [--calls 100] [--rounds 3]
Prints a table (microseconds a call, the best of the rounds) and the largest difference
between the two forms' outputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations" / "vllm"))
from torch_pjrt_vllm.paged_attention import (  # noqa: E402
    _ragged_paged_attention_jax,
    _ragged_paged_attention_xla,
)

from torch_pjrt.runtime import cpu_kernels  # noqa: E402

BLOCK, PAGES, BLOCKS = 16, 16, 2048
# (name, requests, kv heads, heads, head size, prefill): the tiny Llama's heads, and 8 over 2
CASES = [("decode, 16 requests, 2 heads / 1 kv", 16, 1, 2, 64, False),
         ("decode, 16 requests, 8 heads / 2 kv", 16, 2, 8, 64, False),
         ("prefill, 4 requests of 1-39 rows", 4, 1, 2, 64, True),
         ("prefill, 8 requests of 1-39 rows", 8, 2, 8, 64, True)]


def _inputs(requests: int, kv_heads: int, heads: int, d: int, prefill: bool, seed: int = 0):
    """A step's arguments: each request's rows after up to 99 cached positions, its pages
    drawn at random from the cache."""
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((BLOCKS, BLOCK, 2, kv_heads, d), np.float32)
    q_lens = rng.integers(1, 40, requests) if prefill else np.ones(requests, int)
    lens = (q_lens + rng.integers(0, 100, requests)).astype(np.int32)
    query = rng.standard_normal((int(q_lens.sum()), heads, d), np.float32)
    table = np.zeros((requests, PAGES), np.int32)
    for r in range(requests):
        n = (lens[r] + BLOCK - 1) // BLOCK
        table[r, :n] = rng.choice(np.arange(1, BLOCKS), n, replace=False)
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    args = tuple(jnp.asarray(a) for a in (query, cache, table, starts, lens))
    return args, (query.shape[0] if prefill else 1)


def _time(fn, args, max_query_len: int, calls: int, rounds: int):
    jitted = jax.jit(fn, static_argnums=(5, 6))
    out = jitted(*args, 0.125, max_query_len).block_until_ready()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            last = jitted(*args, 0.125, max_query_len)
        last.block_until_ready()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best, np.asarray(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not cpu_kernels.available():
        sys.exit("the native kernels are off here (TORCH_PJRT_CPU_KERNELS=0, another "
                 "platform, or a torch without MKL): nothing to compare")
    print("| case | pure JAX, us | native kernel, us | ratio | max difference |")
    print("|---|---|---|---|---|")
    for name, requests, kv_heads, heads, d, prefill in CASES:
        inputs, max_query_len = _inputs(requests, kv_heads, heads, d, prefill)
        xla, want = _time(_ragged_paged_attention_xla, inputs, max_query_len, args.calls,
                          args.rounds)
        native, got = _time(_ragged_paged_attention_jax, inputs, max_query_len, args.calls,
                            args.rounds)
        print(f"| {name} ({inputs[0].shape[0]} rows) | {xla:.1f} | {native:.1f} | "
              f"{xla / native:.2f}x | {np.abs(want - got).max():.1e} |", flush=True)


if __name__ == "__main__":
    main()
