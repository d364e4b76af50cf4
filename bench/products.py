"""The GPT step's matrix products, jitted alone: PyTorch (MKL), XLA's dot, and the MKL
GEMM that torch-pjrt calls on XLA:CPU (runtime/cpu_kernels.py).

    python bench/products.py [--smoke]

Shapes are those of `bench/train.py`'s GPT (4 layers, d=256, seq 128, batch 8): each
linear layer's forward, input gradient and weight gradient, and the attention products
(batch 8 x 4 heads of 64-row query blocks). Times are milliseconds per set, the
candidates interleaved; run on the cpu platform.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np
import torch
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, interleaved, timer, write_report  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from torch_pjrt.runtime import client, cpu_kernels  # noqa: E402

# (name, a shape, b shape, a transposed, b transposed): C = op(a) @ op(b)
_LINEARS = [("qkv", 1024, 256, 768), ("proj", 1024, 256, 256), ("fc1", 1024, 256, 1024),
            ("fc2", 1024, 1024, 256), ("head", 1024, 256, 512)]
_ATTENTION = [((8, 4, 64, 64), (8, 4, 64, 64), False, True),
              ((8, 4, 64, 64), (8, 4, 128, 64), False, True),
              ((8, 4, 64, 64), (8, 4, 64, 64), False, False),
              ((8, 4, 64, 128), (8, 4, 128, 64), False, False),
              ((8, 4, 64, 64), (8, 4, 64, 64), True, False),
              ((8, 4, 64, 128), (8, 4, 64, 64), True, False)]


def _products():
    """{set: [(a shape, b shape, ta, tb)]}"""
    linear = []
    for _, m, k, n in _LINEARS:
        linear += [((m, k), (n, k), False, True),  # x @ W^T
                   ((m, n), (n, k), False, False),  # dX = g @ W
                   ((m, n), (m, k), True, False)]  # dW = g^T @ x
    return {"linear layers (15 products)": linear, "attention (6 products)": _ATTENTION}


def _candidates(a, b, ta, tb, n):
    rank = a.ndim
    ca, cb = (rank - 2 if ta else rank - 1,), (rank - 1 if tb else rank - 2,)
    batch = tuple(range(rank - 2))
    xla = jax.jit(lambda x, y: lax.dot_general(x, y, ((ca, cb), (batch, batch)),
                                               precision=lax.Precision.HIGHEST))
    m = a.shape[-1] if ta else a.shape[-2]
    cols = b.shape[-2] if tb else b.shape[-1]
    out = jax.ShapeDtypeStruct(a.shape[:-2] + (m, cols), np.float32)
    gemm = jax.jit(lambda x, y: jax.ffi.ffi_call(cpu_kernels.GEMM, out)(
        cpu_kernels._hint(x), x, y, ta=ta, tb=tb))
    A, B = torch.from_numpy(a), torch.from_numpy(b)
    A, B = (A.mT if ta else A), (B.mT if tb else B)
    aj, bj = jax.device_put(a, client.device(0)), jax.device_put(b, client.device(0))
    expected = torch.matmul(A, B).numpy()
    for f in (xla, gemm):
        np.testing.assert_allclose(np.asarray(f(aj, bj)), expected, rtol=1e-3, atol=1e-3)
    return {"torch": timer(lambda: torch.matmul(A, B), n),
            "xla dot": timer(lambda: xla(aj, bj).block_until_ready(), n),
            "pjrt gemm": timer(lambda: gemm(aj, bj).block_until_ready(), n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few iterations, no report")
    args = parser.parse_args()
    if not cpu_kernels.available():
        sys.exit("bench/products.py: needs the cpu platform, an MKL build of torch and "
                 "TORCH_PJRT_CPU_KERNELS=1")
    rng = np.random.default_rng(0)
    n, rounds = (2, 1) if args.smoke else (20, 7)
    table = {}
    for group, shapes in _products().items():
        totals: dict[str, float] = {}
        for sa, sb, ta, tb in shapes:
            a = rng.standard_normal(sa, np.float32)
            b = rng.standard_normal(sb, np.float32)
            for k, v in interleaved(_candidates(a, b, ta, tb, n), rounds).items():
                totals[k] = totals.get(k, 0.0) + v
        table[group] = {k: v * 1e3 for k, v in totals.items()}
    lines = ["| products | torch (MKL) ms | XLA dot ms | pjrt GEMM ms | XLA / torch | "
             "GEMM / torch |", "|---|---|---|---|---|---|"]
    for group, t in table.items():
        lines.append(f"| {group} | {t['torch']:.2f} | {t['xla dot']:.2f} | "
                     f"{t['pjrt gemm']:.2f} | {t['xla dot'] / t['torch']:.2f}x | "
                     f"{t['pjrt gemm'] / t['torch']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if not args.smoke:
        write_report("products", {"environment": environment(), "ms": table},
                     "Matrix products of the GPT step, jitted alone (`python bench/products.py`):"
                     "\n\n" + text)


if __name__ == "__main__":
    main()
