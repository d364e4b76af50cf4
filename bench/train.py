"""GPT training-step time: native CPU eager, Inductor, pjrt in every mode, and plain JAX;
and bfloat16 autocast (float32 parameters) beside float32, natively and in pjrt fused eager.

    python bench/train.py [--config demo|gpt|all] [--steps N] [--smoke] [--print-only]

Every candidate starts from the same weights and sees the same batches; they take
turns (a few steps each, round after round) so the machine's noise hits them alike.
Reported: median seconds per step after warm-up, the ratio to native CPU eager, the
warm-up (compile) seconds, and the loss after the last step (a fast wrong answer
shows there). The same script runs unchanged on a GPU/TPU PJRT platform.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, settle, write_report  # noqa: E402
from jax_gpt import JaxTrainer  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.demo.model import GPT, GPTConfig  # noqa: E402

CONFIGS = {
    "demo": (GPTConfig(vocab=256, seq_len=64, layers=2, d_model=128, heads=4), 16),
    "gpt": (GPTConfig(vocab=512, seq_len=128, layers=4, d_model=256, heads=4), 8),
}
LR = 1e-3


class TorchTrainer:
    """A model + AdamW on one device, in one execution mode."""

    def __init__(self, name: str, model: GPT, device: str, mode: str | None,
                 compile_backend: str | None = None, autocast: torch.dtype | None = None):
        self.name, self.device, self.mode, self.autocast = name, device, mode, autocast
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.forward = self.model
        if compile_backend is not None:
            self.forward = torch.compile(self.model, backend=compile_backend)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device, dtype=self.autocast or torch.bfloat16,
                            enabled=self.autocast is not None):
            logits = self.forward(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def run(self, batches) -> tuple[float, float]:
        """Seconds for these steps (waiting for the device) and the last loss."""
        ctx = torch_pjrt.set_eager_mode(self.mode) if self.mode else None
        start = time.perf_counter()
        for x, y in batches:
            loss = self.step(x.to(self.device), y.to(self.device))
        value = loss.item()
        if self.device == "pjrt":
            torch.pjrt.synchronize()  # the last step's backward and optimizer step too
        seconds = time.perf_counter() - start
        if ctx is not None:
            ctx.__exit__(None, None, None)
        return seconds, value


def candidates(cfg: GPTConfig, model: GPT, names: list[str]) -> dict[str, Callable]:
    makers = {
        "cpu eager": lambda: TorchTrainer("cpu eager", copy.deepcopy(model), "cpu", None),
        "cpu inductor": lambda: TorchTrainer("cpu inductor", copy.deepcopy(model), "cpu", None,
                                             compile_backend="inductor"),
        "pjrt strict": lambda: TorchTrainer("pjrt strict", copy.deepcopy(model), "pjrt",
                                            "strict"),
        "pjrt fused": lambda: TorchTrainer("pjrt fused", copy.deepcopy(model), "pjrt", "fused"),
        # the eager code around the compiled model (loss, optimizer) in the default mode
        "pjrt compile": lambda: TorchTrainer("pjrt compile", copy.deepcopy(model), "pjrt",
                                             "fused", compile_backend="pjrt"),
        "jax jit": lambda: JaxTrainer(cfg, model, LR),
        "cpu eager bf16": lambda: TorchTrainer("cpu eager bf16", copy.deepcopy(model), "cpu",
                                               None, autocast=torch.bfloat16),
        "pjrt fused bf16": lambda: TorchTrainer("pjrt fused bf16", copy.deepcopy(model), "pjrt",
                                                "fused", autocast=torch.bfloat16),
    }
    return {n: makers[n] for n in names}


def available(names: list[str]) -> list[str]:
    import torch._dynamo

    backends = torch._dynamo.list_backends()
    return [n for n in names if n != "pjrt compile" or "pjrt" in backends]


def bench_config(key: str, names: list[str], steps: int, warmup: int, chunk: int) -> dict:
    cfg, batch = CONFIGS[key]
    import torch._dynamo

    torch._dynamo.reset()  # each config is its own program: no dynamic-shape recompiles
    torch.manual_seed(0)
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen),
             torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen))
            for _ in range(warmup + steps)]
    results = {}
    trainers = {}
    for name, make in candidates(cfg, model, available(names)).items():
        print(f"[{key}] warming up {name}...", file=sys.stderr, flush=True)
        trainers[name] = make()
        # warm up in the timed runs' chunks: fused eager compiles one program per chunk
        # of steps (a chunk is one pending graph), so other chunk sizes would not warm it
        seconds = sum(trainers[name].run(data[start:start + chunk])[0]
                      for start in range(0, warmup, chunk))
        results[name] = {"warmup_seconds": seconds, "step_seconds": [], "loss": None}
    for start in range(warmup, warmup + steps, chunk):
        for name, trainer in trainers.items():  # taking turns, chunk by chunk
            part = data[start:start + chunk]
            settle()
            seconds, loss = trainer.run(part)
            results[name]["step_seconds"].append(seconds / len(part))
            results[name]["loss"] = loss
    base = statistics.median(results["cpu eager"]["step_seconds"]) \
        if "cpu eager" in results else None
    for r in results.values():
        r["median_step_seconds"] = statistics.median(r["step_seconds"])
        r["ratio_to_cpu_eager"] = r["median_step_seconds"] / base if base else None
    return {"config": {**cfg.__dict__, "batch": batch}, "steps": steps, "warmup": warmup,
            "results": results}


def markdown(report: dict) -> str:
    lines = ["## GPT training step (`python bench/train.py`)", ""]
    for key, r in report["configs"].items():
        c = r["config"]
        lines += [f"**{key}**: {c['layers']} layers, d={c['d_model']}, {c['heads']} heads, "
                  f"seq {c['seq_len']}, batch {c['batch']}, vocab {c['vocab']}; "
                  f"{r['steps']} timed steps after {r['warmup']} warm-up steps.", "",
                  "| candidate | ms / step | vs CPU eager | warm-up s | loss after last step |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, x in r["results"].items():
            ratio = f"{x['ratio_to_cpu_eager']:.2f}x" if x["ratio_to_cpu_eager"] else "-"
            lines.append(f"| {name} | {x['median_step_seconds'] * 1e3:.1f} | {ratio} | "
                         f"{x['warmup_seconds']:.1f} | {x['loss']:.4f} |")
        lines.append("")
    lines.append(f"Environment: `{report['environment']}`")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", choices=(*CONFIGS, "all"), default="all")
    p.add_argument("--candidates", default="cpu eager,cpu inductor,pjrt strict,pjrt fused,"
                   "pjrt compile,jax jit,cpu eager bf16,pjrt fused bf16",
                   help="comma-separated; the bf16 ones run under torch.autocast(bfloat16)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--chunk", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="demo config, 2 steps, no Inductor; "
                   "for CI")
    p.add_argument("--print-only", action="store_true",
                   help="print the table without writing docs/benchmarks.md and bench/results")
    args = p.parse_args()
    names = [n.strip() for n in args.candidates.split(",")]
    keys = list(CONFIGS) if args.config == "all" else [args.config]
    if args.smoke:
        keys, args.steps, args.warmup, args.chunk = ["demo"], 2, 1, 1
        names = [n for n in names if n != "cpu inductor"]
    report = {"environment": environment(),
              "configs": {k: bench_config(k, names, args.steps, args.warmup, args.chunk)
                          for k in keys}}
    text = markdown(report)
    print(text)
    if not (args.smoke or args.print_only):
        write_report("train", report, text)


if __name__ == "__main__":
    main()
