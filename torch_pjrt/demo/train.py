"""`python -m torch_pjrt demo`: train the GPT on the pjrt device, optionally beside the CPU."""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import time

import torch
from tqdm import tqdm

from . import board, plot
from . import data as text
from .model import GPT, SIZES, GPTConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("strict", "fused", "compile"), default="fused",
                   help="execution mode on the pjrt device (default: fused)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--model-size", choices=tuple(SIZES), default="tiny")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data", metavar="FILE", help="train on this text file (default: the "
                   "Python standard library's sources)")
    p.add_argument("--device", default="pjrt", help="device to train on (default: pjrt)")
    p.add_argument("--compare-cpu", action="store_true",
                   help="also train on CPU PyTorch from the same weights and compare losses")
    p.add_argument("--plot", metavar="FILE", help="draw the loss curves to this PNG "
                   "(needs matplotlib: pip install \"torch-pjrt[plot]\")")
    p.add_argument("--tensorboard", metavar="DIR", help="log loss, tokens/s and the backend's "
                   "metrics to this TensorBoard directory (needs tensorboard: "
                   "pip install \"torch-pjrt[tensorboard]\")")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32",
                   help="bf16 or fp16: torch.autocast to that dtype (fp16 with a GradScaler); "
                        "fp32: no autocast (default)")
    p.add_argument("--param-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: parameters (and optimizer state) in bfloat16, "
                        "model.to(torch.bfloat16) (default fp32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", choices=("ddp", "fsdp", "tp"),
                   help="under torchrun: train on its processes with DistributedDataParallel, "
                        "FSDP2 (fully_shard) or tensor parallelism (the global batch is "
                        "--batch-size; --compare-cpu adds one CPU process on it)")
    p.add_argument("--sample-bytes", type=int, default=160)


PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PARAM_NAMES = {"fp32": "float32", "bf16": "bfloat16"}


def autocast(args, device: str):
    """The autocast region of --precision (none for fp32)."""
    dtype = PRECISIONS[getattr(args, "precision", "fp32")]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def check_precision(args) -> None:
    if args.param_dtype == "bf16" and args.precision == "fp16":
        # autocast would mix float16 activations with bfloat16 weights, which it refuses
        raise SystemExit("torch_pjrt demo: --param-dtype bf16 goes with --precision bf16 or "
                         "fp32, not fp16")


class Progress:
    """Training progress on stderr: a tqdm bar with the loss and tokens/s on a terminal;
    elsewhere (a log file) a plain line every tenth of the run instead of a redrawn bar.
    Also what --tensorboard logs at each step."""

    def __init__(self, total: int, tokens_per_step: int, enabled: bool, board=None):
        self.total, self.tokens, self.board = total, tokens_per_step, board
        self.bar = tqdm(total=total, unit="step", file=sys.stderr, leave=True,
                        dynamic_ncols=True, disable=None if enabled else True)
        self.plain = enabled and self.bar.disable  # enabled, but stderr is no terminal
        self.start = time.perf_counter()

    def update(self, step: int, loss: float) -> None:
        rate = step * self.tokens / max(time.perf_counter() - self.start, 1e-9)
        if self.board is not None:
            self.board.step(step, loss, rate)
        if not self.bar.disable:
            self.bar.set_postfix_str(f"loss {loss:.3f}, {rate / 1000:.1f}k tok/s", refresh=False)
            self.bar.update(1)
        elif self.plain and (step % max(self.total // 10, 1) == 0 or step == self.total):
            print(f"  step {step}/{self.total}: loss {loss:.3f}, {rate / 1000:.1f}k tok/s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def _mode_context(mode: str, device: str):
    import torch_pjrt

    if not device.startswith("pjrt"):
        return None
    return torch_pjrt.set_eager_mode("strict" if mode == "compile" else mode)


def _compile_step_model(model: GPT, mode: str):
    if mode != "compile":
        return model
    import torch._dynamo

    if "pjrt" not in torch._dynamo.list_backends():
        raise SystemExit("torch_pjrt demo: --mode compile needs torch.compile(backend='pjrt'), "
                         "which is not available yet; use --mode fused or --mode strict")
    return torch.compile(model, backend="pjrt")


@torch.no_grad()
def evaluate(model: GPT, val: torch.Tensor, cfg: GPTConfig, device: str, args=None,
             batches: int = 4, batch_size: int = 16) -> float:
    gen = torch.Generator().manual_seed(1234)
    total = 0.0
    for _ in range(batches):
        x, y = text.batch(val, batch_size, cfg.seq_len, gen)
        with autocast(args, device):
            _, loss = model(x.to(device), y.to(device))
        total += loss.item()
    return total / batches


def train(model: GPT, train_data: torch.Tensor, cfg: GPTConfig, args, device: str,
          progress: bool, board=None) -> tuple[list[float], float | None]:
    """The losses of every step, and when (perf_counter) the first step had finished;
    `board` (board.Board), if given, logs each step."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    step_model = _compile_step_model(model, args.mode if device.startswith("pjrt") else "eager")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # float16 gradients underflow without loss scaling (bfloat16 has float32's range)
    scaler = torch.amp.GradScaler(torch.device(device).type,
                                  enabled=getattr(args, "precision", "fp32") == "fp16")
    bar = Progress(args.steps, args.batch_size * cfg.seq_len, progress, board)
    losses = []
    first_done = None
    for step in range(1, args.steps + 1):
        x, y = text.batch(train_data, args.batch_size, cfg.seq_len, gen)
        with autocast(args, device):
            _, loss = step_model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if step == 1:
            first_done = time.perf_counter()
        bar.update(step, losses[-1])
    bar.close()
    return losses, first_done


def run(args) -> int:
    import torch_pjrt

    if getattr(args, "parallel", None):
        from . import parallel

        return parallel.run(args)
    check_precision(args)
    if args.plot:
        plot.require()
    if args.tensorboard:
        board.require()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(**{**SIZES[args.model_size].__dict__, "seq_len": args.seq_len})
    corpus = text.load(args.data)
    train_data, val_data = text.split(corpus)
    model = GPT(cfg)
    initial = copy.deepcopy(model.state_dict())
    device = args.device
    source = args.data or "the Python standard library's sources"
    print(f"torch-pjrt demo: GPT-{args.model_size} ({model.num_params() / 1e6:.2f}M params, "
          f"{cfg.layers} layers, d={cfg.d_model}) on {device}, mode={args.mode}, "
          f"precision={args.precision}, parameters {PARAM_NAMES[args.param_dtype]}")
    print(f"  data: {source}, {len(corpus) / 1e6:.1f} MB bytes "
          f"(train {len(train_data) / 1e6:.1f} MB / validation {len(val_data) / 1e6:.1f} MB)")
    if device.startswith("pjrt"):
        print(f"  device: {torch.pjrt.get_device_name()} ({torch.pjrt.device_count()} "
              "PJRT device(s))")

    torch_pjrt.counters.reset()
    start = time.perf_counter()
    ctx = _mode_context(args.mode, device)
    model.to(device)
    if args.param_dtype == "bf16":
        model.to(torch.bfloat16)
    val_before = evaluate(model, val_data, cfg, device, args)
    run_name = f"{device.replace(':', '')}-{args.mode}-{args.precision}"
    boards = [board.Board(args.tensorboard, run_name, device)] if args.tensorboard else []
    losses, first_done = train(model, train_data, cfg, args, device, progress=True,
                               board=boards[0] if boards else None)
    val_after = evaluate(model, val_data, cfg, device, args)
    for b in boards:
        b.validation(0, val_before)
        b.validation(args.steps, val_after)
    prompt = torch.tensor([list(b"def ")], dtype=torch.long, device=device)
    drawn: list[int] = []  # streamed as they are drawn, as a chat UI would
    with autocast(args, device):
        model.generate(prompt, args.sample_bytes,
                       on_token=lambda t: drawn.append(int(t[0, 0])))
    sample = bytes(list(b"def ") + drawn).decode("utf-8", errors="replace")
    if device.startswith("pjrt"):
        torch.pjrt.synchronize()
    total = time.perf_counter() - start
    if ctx is not None:
        ctx.__exit__(None, None, None)
    m = torch_pjrt.metrics()

    print(f"  validation loss: {val_before:.3f} -> {val_after:.3f} "
          f"(train loss {losses[0]:.3f} -> {losses[-1]:.3f})")
    print("  sample:\n    " + sample.replace("\n", "\n    "))
    compile_s = m.get("compile_seconds", 0.0)
    if first_done is not None:
        # With a warm persistent compile cache this is a fraction of a cold start's.
        print(f"  first training step done {first_done - start:.1f} s after the start "
              f"({m.get('disk_cache_hits', 0)} programs from the disk cache)")
    print(f"  time: {total:.1f} s: compile {compile_s:.1f} s, run {total - compile_s:.1f} s "
          f"({m.get('compiles', 0)} compiles, {m.get('cache_hits', 0)} op cache hits, "
          f"{m.get('graph_cache_hits', 0)} graph cache hits, "
          f"{len(m.get('cpu_fallbacks', {}))} ops on CPU fallback)")

    low = args.precision != "fp32" or args.param_dtype != "fp32"
    series = {f"{device} ({args.mode}{', ' + args.precision if low else ''})": losses}
    if args.compare_cpu:
        cpu_model = GPT(cfg)
        cpu_model.load_state_dict(initial)
        cpu_args = copy.copy(args)
        cpu_args.mode, cpu_args.precision, cpu_args.param_dtype = "eager", "fp32", "fp32"
        print("  CPU PyTorch in float32, same initial weights and batches:")
        if args.tensorboard:
            boards.append(board.Board(args.tensorboard, "cpu-eager-fp32", "cpu"))
        cpu_losses, _ = train(cpu_model, train_data, cfg, cpu_args, "cpu", progress=True,
                              board=boards[-1] if args.tensorboard else None)
        series["cpu (PyTorch eager, float32)"] = cpu_losses
        diffs = [abs(a - b) for a, b in zip(losses, cpu_losses)]
        print("  step    pjrt loss   cpu loss    |diff|")
        for i in sorted({0, len(losses) // 4, len(losses) // 2, 3 * len(losses) // 4,
                         len(losses) - 1}):
            print(f"  {i + 1:4d}   {losses[i]:9.5f}  {cpu_losses[i]:9.5f}  {diffs[i]:.2e}")
        print(f"  largest loss difference over {len(diffs)} steps: {max(diffs):.2e}")
    for b in boards:
        b.close()
    if args.tensorboard:
        print(f"  TensorBoard logs in {args.tensorboard} (tensorboard --logdir "
              f"{args.tensorboard})")
    if args.plot:
        plot.loss_plot(args.plot, series, f"torch-pjrt demo: GPT-{args.model_size}, "
                       f"{args.steps} steps, batch {args.batch_size} x {args.seq_len} bytes")
        print(f"  loss curves drawn in {args.plot}")
    ok = math.isfinite(losses[-1]) and losses[-1] < losses[0]
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt demo", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))
