"""Memory and time of causal attention forward+backward on pjrt, by sequence length.

Each length runs in a fresh process: F.scaled_dot_product_attention(q, k, v, is_causal=True)
on (1, heads, L, 64) float32 tensors, then backward. Reports torch.pjrt.max_memory_allocated()
(bytes of live tensors: inputs, output, gradients) and the process's peak resident memory
beyond its state before the call, which on XLA:CPU also counts the programs' temporaries (a
dense score matrix would be heads * L * L * 4 bytes: 2 GiB at 8k, 4 heads).

    python bench/attention_memory.py [--lengths 4096 8192 16384] [--heads 4]

Run it once as is (float32 attention without a mask takes ATen's CPU flash kernel on XLA:CPU)
and once with TORCH_PJRT_CPU_KERNELS=0 (the pure XLA lowering, the path every other platform
takes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

_CHILD = "--child"


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _child(length: int, heads: int, dim: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, dim, device="pjrt", requires_grad=True)
               for _ in range(3))
    torch.pjrt.synchronize()
    torch.pjrt.reset_peak_memory_stats()
    base_live, base_rss = torch.pjrt.memory_allocated(), _peak_rss()
    start = time.perf_counter()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    torch.pjrt.synchronize()
    seconds = time.perf_counter() - start
    return {"length": length, "heads": heads, "dim": dim, "seconds": round(seconds, 2),
            "inputs_bytes": base_live,
            "max_allocated_bytes": torch.pjrt.max_memory_allocated(),
            "peak_rss_growth_bytes": max(0, _peak_rss() - base_rss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(_CHILD, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.lengths[0], args.heads, args.dim)))
        return
    kernels = os.environ.get("TORCH_PJRT_CPU_KERNELS", "1")
    print(f"causal SDPA forward+backward, float32, batch 1, {args.heads} heads, dim {args.dim}, "
          f"TORCH_PJRT_CPU_KERNELS={kernels}")
    print("| L | time (s) | max_memory_allocated (MiB) | peak RSS growth (MiB) |")
    print("| --- | --- | --- | --- |")
    for length in args.lengths:
        out = subprocess.run([sys.executable, __file__, _CHILD, "--lengths", str(length),
                              "--heads", str(args.heads), "--dim", str(args.dim)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        mib = 1 << 20
        print(f"| {length} | {r['seconds']} | {r['max_allocated_bytes'] / mib:.0f} | "
              f"{r['peak_rss_growth_bytes'] / mib:.0f} |", flush=True)


if __name__ == "__main__":
    main()
