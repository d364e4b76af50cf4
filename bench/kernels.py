"""The ATen kernels torch-pjrt calls inside XLA:CPU programs, jitted alone: native
PyTorch, the op's lowering in XLA's own code, and the same lowering calling ATen's
kernel (runtime/cpu_kernels.py).

    python bench/kernels.py [--smoke]

Shapes are those of `bench/train.py`'s GPT (4 layers, d=256, seq 128, batch 8): layer
norm of [1024, 256], exact GELU of the MLP's [1024, 1024], causal attention of 8 x 4
heads x 128 positions x 64 (q, k, v transposes of [B, L, H, E], as the model makes
them). Times are milliseconds per call (forward and backward together), the candidates
interleaved; run on the cpu platform. Whether a kernel pays depends on the processor:
compare the columns on the machine at hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, interleaved, timer, write_report  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from torch_pjrt.lowering import families, registry  # noqa: E402,F401 (fills the table)
from torch_pjrt.runtime import client, cpu_kernels  # noqa: E402

aten = torch.ops.aten


def _lowered(op):
    return registry.get(op).fn


def _layer_norm(rng):
    x, w, b, g = (rng.standard_normal(s, np.float32) for s in
                  ((1024, 256), (256,), (256,), (1024, 256)))
    fwd, bwd = (_lowered(aten.native_layer_norm.default),
                _lowered(aten.native_layer_norm_backward.default))

    def jax_fn(x, w, b, g):
        y, mean, rstd = fwd(x, (256,), w, b, 1e-5)
        return y, bwd(g, x, (256,), mean, rstd, w, b, (True, True, True))

    def torch_fn(x, w, b, g):
        y, mean, rstd = aten.native_layer_norm(x, (256,), w, b, 1e-5)
        return y, aten.native_layer_norm_backward(g, x, (256,), mean, rstd, w, b,
                                                  (True, True, True))
    return "layer norm [1024, 256]", jax_fn, torch_fn, (x, w, b, g)


def _gelu(rng):
    x, g = (rng.standard_normal((1024, 1024), np.float32) for _ in range(2))
    fwd, bwd = _lowered(aten.gelu.default), _lowered(aten.gelu_backward.default)
    return ("exact GELU [1024, 1024]", lambda x, g: (fwd(x), bwd(g, x)),
            lambda x, g: (aten.gelu(x), aten.gelu_backward(g, x)), (x, g))


def _attention(rng):
    q, k, v, g = (rng.standard_normal((8, 128, 4, 64), np.float32) for _ in range(4))
    fwd = _lowered(aten._scaled_dot_product_fused_attention_overrideable.default)
    bwd = _lowered(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
    key = jax.random.key(0)
    mask = [True, True, True, False]

    def jax_fn(q, k, v, g):
        q, k, v, g = (jnp.swapaxes(t, 1, 2) for t in (q, k, v, g))
        out, lse, _, _, seed, offset, _ = fwd(q, k, v, None, 0.0, True, key=key)
        grads = bwd(g, q, k, v, None, mask, out, lse, None, None, 128, 128, 0.0, True,
                    seed, offset)
        return [jnp.swapaxes(t, 1, 2) for t in (out, *grads[:3])]

    def torch_fn(q, k, v, g):
        q, k, v, g = (t.transpose(1, 2) for t in (q, k, v, g))
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, out, lse, 0.0, True)
        return [t.transpose(1, 2) for t in (out, *grads)]
    return "causal attention 8 x 4 x 128 x 64", jax_fn, torch_fn, (q, k, v, g)


def _candidates(jax_fn, torch_fn, arrays, n):
    args = [jax.device_put(a, client.device(0)) for a in arrays]
    with mock.patch.object(cpu_kernels, "_has", lambda target: False):
        xla = jax.jit(jax_fn).lower(*args).compile()  # traced with the kernels off
    aten_kernel = jax.jit(jax_fn).lower(*args).compile()
    tensors = [torch.from_numpy(a) for a in arrays]
    expected = jax.tree.leaves(torch_fn(*tensors))
    for f in (xla, aten_kernel):
        for got, want in zip(jax.tree.leaves(f(*args)), expected):
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=2e-3, atol=2e-3)
    return {"torch": timer(lambda: torch_fn(*tensors), n),
            "xla": timer(lambda: jax.block_until_ready(xla(*args)), n),
            "aten kernel": timer(lambda: jax.block_until_ready(aten_kernel(*args)), n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few iterations, no report")
    args = parser.parse_args()
    if not cpu_kernels.available():
        sys.exit("bench/kernels.py: needs the cpu platform, an MKL build of torch and "
                 "TORCH_PJRT_CPU_KERNELS=1")
    rng = np.random.default_rng(0)
    n, rounds = (2, 1) if args.smoke else (30, 7)
    lines = ["| forward + backward | native torch ms | XLA's own ms | ATen kernel in XLA ms | "
             "XLA / torch | kernel / torch |", "|---|---|---|---|---|---|"]
    table = {}
    for make in (_layer_norm, _gelu, _attention):
        name, jax_fn, torch_fn, arrays = make(rng)
        t = {k: v * 1e3 for k, v in interleaved(_candidates(jax_fn, torch_fn, arrays, n),
                                                rounds).items()}
        table[name] = t
        lines.append(f"| {name} | {t['torch']:.3f} | {t['xla']:.3f} | {t['aten kernel']:.3f} "
                     f"| {t['xla'] / t['torch']:.2f}x | {t['aten kernel'] / t['torch']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if not args.smoke:
        write_report("kernels", {"environment": environment(), "ms": table},
                     "ATen kernels inside XLA programs, jitted alone "
                     "(`python bench/kernels.py`):\n\n" + text)


if __name__ == "__main__":
    main()
