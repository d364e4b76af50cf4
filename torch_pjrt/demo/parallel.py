"""`torchrun --nproc-per-node N -m torch_pjrt demo --parallel ddp|fsdp|tp`: the demo GPT
trained by N processes with PyTorch's own DDP, FSDP2 or tensor parallelism on pjrt."""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.distributed as dist

from . import data as text
from .model import GPT, SIZES, GPTConfig
from .train import PARAM_NAMES, Progress, _mode_context, autocast, evaluate
from .train import train as train_one

KINDS = ("ddp", "fsdp", "tp")


def _check(args, n: int) -> None:
    if args.precision == "fp16" or args.param_dtype != "fp32":
        raise SystemExit("torch_pjrt demo: --parallel trains with --precision fp32 or bf16 "
                         "(float32 parameters)")
    if args.parallel != "tp" and args.batch_size % n:
        raise SystemExit(f"torch_pjrt demo: --batch-size {args.batch_size} does not split "
                         f"over {n} processes")
    if args.parallel == "tp" and (4 * SIZES[args.model_size].d_model) % n:
        raise SystemExit(f"torch_pjrt demo: the MLP does not split over {n} processes")


def _wrap(model: GPT, kind: str, n: int) -> GPT:
    """The model as `kind` parallelizes it over the n processes (each its device)."""
    from torch.distributed.device_mesh import init_device_mesh

    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    mesh = init_device_mesh("pjrt", (n,))
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    # Each block's MLP split over the processes (Megatron's column then row split, one
    # all-reduce per MLP in the forward and one in the backward); the attention (one fused
    # qkv projection) and the embeddings stay whole on every process.
    for block in model.blocks:
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model


def train_parallel(args) -> dict:
    """Train as --parallel says; every process returns the global batch's losses (and,
    with --compare-cpu, rank 0 also those of one CPU process on the global batch)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _check(args, n)
    torch.manual_seed(args.seed)
    cfg = GPTConfig(**{**SIZES[args.model_size].__dict__, "seq_len": args.seq_len})
    corpus = text.load(args.data)
    train_data, val_data = text.split(corpus)
    model = GPT(cfg)
    initial = copy.deepcopy(model.state_dict())
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"torch-pjrt demo: GPT-{args.model_size} ({model.num_params() / 1e6:.2f}M params) "
        f"on {n} processes, --parallel {args.parallel}, mode={args.mode}, "
        f"precision={args.precision}, parameters {PARAM_NAMES[args.param_dtype]}, global "
        f"batch {args.batch_size}")
    start = time.perf_counter()
    with _mode_context(args.mode, "pjrt"):
        model.to("pjrt")
        wrapped = _wrap(model, args.parallel, n)
        plain = model if args.parallel != "ddp" else wrapped.module
        val_before = evaluate(plain, val_data, cfg, "pjrt", args)
        if args.parallel == "fsdp":
            # A forward without backward leaves the root's parameters unsharded; training
            # would then read them, not the shards the optimizer updates (as on CUDA).
            model.reshard()
        step_model = torch.compile(wrapped, backend="pjrt") if args.mode == "compile" \
            else wrapped
        losses = _train(step_model, model, train_data, cfg, args, rank, n)
        val_after = evaluate(plain, val_data, cfg, "pjrt", args)
        torch.pjrt.synchronize()
    say(f"  validation loss: {val_before:.3f} -> {val_after:.3f} "
        f"(train loss {losses[0]:.3f} -> {losses[-1]:.3f}), {time.perf_counter() - start:.1f} s")
    out = {"losses": losses, "val": [val_before, val_after]}
    if args.compare_cpu:
        if rank == 0:
            cpu_model = GPT(cfg)
            cpu_model.load_state_dict(initial)
            cpu_args = copy.copy(args)
            cpu_args.mode, cpu_args.precision = "eager", "fp32"
            say("  one CPU PyTorch process in float32 on the global batch, same initial "
                "weights and batches:")
            out["cpu_losses"], _ = train_one(cpu_model, train_data, cfg, cpu_args, "cpu",
                                             progress=True)
            _print_comparison(losses, out["cpu_losses"], n)
        dist.barrier()
    return out


def _train(step_model, model: GPT, train_data, cfg: GPTConfig, args, rank: int, n: int
           ) -> list[float]:
    gen = torch.Generator().manual_seed(args.seed + 1)  # as train.train: the same batches
    # AdamW's foreach kernels take parameters of one kind: DTensors (tp) go one by one.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            foreach=args.parallel != "tp")
    bar = Progress(args.steps, args.batch_size * cfg.seq_len, rank == 0)
    rows = slice(rank * args.batch_size // n, (rank + 1) * args.batch_size // n)
    losses = []
    for step in range(1, args.steps + 1):
        x, y = text.batch(train_data, args.batch_size, cfg.seq_len, gen)  # the global batch
        if args.parallel != "tp":  # data parallel: each process its rows
            x, y = x[rows], y[rows]
        with autocast(args, "pjrt"):
            _, loss = step_model(x.to("pjrt"), y.to("pjrt"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().float()
        if args.parallel != "tp":  # the global batch's loss: the mean of the parts'
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
        bar.update(step, losses[-1])
    bar.close()
    return losses


def _print_comparison(losses: list[float], cpu_losses: list[float], n: int) -> None:
    diffs = [abs(a - b) for a, b in zip(losses, cpu_losses)]
    print(f"  step    {n} processes   1 CPU process   |diff|")
    for i in sorted({0, len(losses) // 4, len(losses) // 2, 3 * len(losses) // 4,
                     len(losses) - 1}):
        print(f"  {i + 1:4d}   {losses[i]:11.5f}   {cpu_losses[i]:13.5f}   {diffs[i]:.2e}")
    print(f"  largest loss difference over {len(diffs)} steps: {max(diffs):.2e}")


def run(args) -> int:
    """The demo under torchrun (the job from torchrun's variables)."""
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,pjrt:pjrt")
    try:
        losses = train_parallel(args)["losses"]
    finally:
        dist.destroy_process_group()
    return 0 if math.isfinite(losses[-1]) and losses[-1] < losses[0] else 1
