"""Custom kernels (torch_pjrt.kernels): each shipped Pallas kernel against the plain
lowering of the same math, and the cost of calling a custom op against a built-in op.

    python bench/custom_kernels.py [--smoke]

Kernels: forward and backward of each op of `torch_pjrt.kernels.examples` on pjrt tensors
(fused eager, synchronized each step) against the same math written with PyTorch ops on
pjrt (F.rms_norm, F.cross_entropy(reduction="none"), F.scaled_dot_product_attention), which
run through their lowerings. On XLA:CPU the Pallas kernels run in Pallas's interpreter (a
loop over the grid inside the program), so those rows measure the interpreter, not what the
kernels do where Pallas compiles natively (TPU, GPU).

Op-call overhead: microseconds per call of a custom op (`register_jax`, x + 1 on 8 floats)
against `torch.add(x, 1)` of the same size, in fused eager (recorded, one flush per 200
calls) and strict eager (one program run per call), called through torch.ops: a custom_op
with the jax.vjp autograd kernel, one registered with vjp_autograd=False (custom_op's own
Python autograd kernel still runs), and an op of torch.library.define with no autograd
kernel (no Python on its call path).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, interleaved, timer, write_report  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.kernels import examples, pallas, register_jax  # noqa: E402


def _step(fn, args, grad):
    """One forward and backward, synchronized."""
    def run():
        for a in args:
            a.grad = None
        fn(*args).backward(grad)
        torch.pjrt.synchronize()
    return run


def _leaves(*ts):
    return [t.to("pjrt").requires_grad_() for t in ts]


def _rms_norm():
    x, w = _leaves(torch.randn(1024, 256), torch.randn(256))
    grad = torch.randn(1024, 256).to("pjrt")
    return ("RMSNorm [1024, 256]", lambda x, w: examples.rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (256,), w, 1e-6), [x, w], grad)


def _cross_entropy():
    logits, = _leaves(torch.randn(256, 8192))
    target = torch.randint(0, 8192, (256,)).to("pjrt")
    grad = torch.rand(256).to("pjrt")
    return ("softmax cross-entropy [256, 8192]",
            lambda x: examples.softmax_cross_entropy(x, target),
            lambda x: F.cross_entropy(x, target, reduction="none"), [logits], grad)


def _attention():
    q, k, v = _leaves(*(torch.randn(1, 4, 512, 64) for _ in range(3)))
    grad = torch.randn(1, 4, 512, 64).to("pjrt")
    return ("causal attention 1 x 4 x 512 x 64",
            lambda q, k, v: examples.flash_attention(q, k, v, True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [q, k, v], grad)


def kernels(n: int, rounds: int) -> tuple[list[str], dict]:
    lines = ["| forward + backward | Pallas kernel ms | plain lowering ms | kernel / plain |",
             "|---|---|---|---|"]
    table = {}
    for make in (_rms_norm, _cross_entropy, _attention):
        name, kernel, plain, args, grad = make()
        got, want = kernel(*args), plain(*args)
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), atol=2e-4,
                                   rtol=2e-4)
        fns = {"kernel": _step(kernel, args, grad), "plain": _step(plain, args, grad)}
        for f in fns.values():  # compile
            f()
        t = {k: v * 1e3 for k, v in interleaved({k: timer(f, n) for k, f in fns.items()},
                                                rounds).items()}
        table[name] = t
        lines.append(f"| {name} | {t['kernel']:.2f} | {t['plain']:.2f} | "
                     f"{t['kernel'] / t['plain']:.2f}x |")
    return lines, table


@torch.library.custom_op("pjrt_bench::add_one", mutates_args=())
def _add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@torch.library.custom_op("pjrt_bench::add_one_no_grad", mutates_args=())
def _add_one_no_grad(x: torch.Tensor) -> torch.Tensor:
    return x + 1


_add_one.register_fake(torch.empty_like)
_add_one_no_grad.register_fake(torch.empty_like)
register_jax(_add_one, lambda x: x + 1)
register_jax(_add_one_no_grad, lambda x: x + 1, vjp_autograd=False)
# an op of torch.library.define with no autograd kernel at all: no Python on its call path
torch.library.define("pjrt_bench::add_one_defined", "(Tensor x) -> Tensor")
torch.library.register_fake("pjrt_bench::add_one_defined", torch.empty_like)
register_jax("pjrt_bench::add_one_defined", lambda x: x + 1, vjp_autograd=False)


def _calls(op, x, calls: int):
    def run():
        for _ in range(calls):
            op(x)
        torch.pjrt.synchronize()
    return run


def overhead(n: int, rounds: int, calls: int) -> tuple[list[str], dict]:
    x = torch.randn(8).to("pjrt")
    ops = {"torch.add(x, 1)": lambda x: torch.add(x, 1),
           "custom op (jax.vjp autograd)": torch.ops.pjrt_bench.add_one.default,
           "custom op (no autograd)": torch.ops.pjrt_bench.add_one_no_grad.default,
           "defined op (no autograd kernel)": torch.ops.pjrt_bench.add_one_defined.default}
    lines = ["| op, 8 floats | fused us/call | strict us/call | fused / built-in | "
             "strict / built-in |", "|---|---|---|---|---|"]
    table = {}
    for mode in ("fused", "strict"):
        with torch_pjrt.set_eager_mode(mode):
            fns = {k: _calls(op, x, calls) for k, op in ops.items()}
            for f in fns.values():
                f()
            t = interleaved({k: timer(f, n) for k, f in fns.items()}, rounds)
        table[mode] = {k: v / calls * 1e6 for k, v in t.items()}
    base = "torch.add(x, 1)"
    for k in ops:
        f, s = table["fused"][k], table["strict"][k]
        lines.append(f"| {k} | {f:.2f} | {s:.2f} | {f / table['fused'][base]:.2f}x | "
                     f"{s / table['strict'][base]:.2f}x |")
    return lines, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few iterations, no report")
    args = parser.parse_args()
    n, rounds, calls = (1, 1, 20) if args.smoke else (3, 5, 200)
    where = "natively" if pallas.native() else "in Pallas's interpreter (XLA:CPU)"
    with torch_pjrt.set_eager_mode("fused"):
        kernel_lines, kernel_table = kernels(n, rounds)
    call_lines, call_table = overhead(n * 3, rounds, calls)
    text = (f"Shipped Pallas kernels, run {where}, against the plain lowering of the same "
            "math (fused eager, forward + backward, synchronized per step; ms per step):\n\n"
            + "\n".join(kernel_lines) +
            "\n\nOn XLA:CPU the kernels run in Pallas's interpreter: these rows measure the "
            "interpreter, not the kernels where Pallas compiles natively.\n\n"
            "Custom-op call overhead (x + 1 on 8 floats, us per call):\n\n"
            + "\n".join(call_lines))
    print(text)
    if not args.smoke:
        write_report("custom_kernels", {"environment": environment(), "pallas": where,
                                        "kernels_ms": kernel_table, "calls_us": call_table},
                     text + f"\n\nCommand: `python bench/custom_kernels.py`. Environment: "
                     f"`{environment()}`")


if __name__ == "__main__":
    main()
