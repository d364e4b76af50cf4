"""Rank code of test_tp.py: DTensor tensor parallelism (parallelize_module with
ColwiseParallel, RowwiseParallel, SequenceParallel) on a transformer block, on pjrt,
against the same block in one CPU process."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import torch_pjrt

TOL = 3e-5
D, HEAD, SEQ, BATCH = 32, 8, 8, 2


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv = (torch.nn.Linear(D, D, bias=False) for _ in range(3))
        self.wo = torch.nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, HEAD).transpose(1, 2) for w in (self.wq, self.wk,
                                                                       self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Linear(D, 4 * D)
        self.w2 = torch.nn.Linear(4 * D, D)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(D)
        self.attention = Attention()
        self.ffn_norm = torch.nn.LayerNorm(D)
        self.feed_forward = FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def _plan(sequence_parallel: bool) -> dict:
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "feed_forward.w1": ColwiseParallel()}
    if not sequence_parallel:
        plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
        return plan
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan.update({
        "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
        "attention": gather, "feed_forward": gather,
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    })
    return plan


def _inputs():
    g = torch.Generator().manual_seed(5)
    return torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, D, generator=g)


def _reference():
    torch.manual_seed(0)
    block = Block()
    x, y = _inputs()
    loss = F.mse_loss(block(x), y)
    loss.backward()
    return loss.item(), {k: p.grad for k, p in block.named_parameters()}


def _tp(sequence_parallel: bool, compiled: bool):
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("pjrt", (n,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    block = Block().to("pjrt")
    parallelize_module(block, mesh, _plan(sequence_parallel))
    run = torch.compile(block, backend="pjrt") if compiled else block
    x, y = _inputs()
    if sequence_parallel:  # each rank holds its part of the sequence
        part = slice(rank * SEQ // n, (rank + 1) * SEQ // n)
        x, y = x[:, part], y[:, part]
    out = run(x.to("pjrt"))
    if isinstance(out, DTensor):
        out = out.to_local()
    loss = F.mse_loss(out, y.to("pjrt"))
    # With sequence parallelism each rank's loss is the mean over its part of the
    # sequence and DTensor sums the ranks' gradients: 1/n of it is the global mean's.
    (loss / n if sequence_parallel else loss).backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {}
    for k, p in block.named_parameters():
        g = p.grad
        grads[k] = (g.full_tensor() if isinstance(g, DTensor) else g).cpu()
    return total.item() / n, grads


def _compare(got, want) -> str | None:
    (loss, grads), (ref_loss, ref_grads) = got, want
    if abs(loss - ref_loss) > TOL * max(1.0, abs(ref_loss)):
        return f"loss {loss} vs {ref_loss}"
    for k, g in ref_grads.items():
        diff = (grads[k] - g).abs().max().item()
        if diff > TOL:
            return f"gradient of {k} differs by {diff}"
    return None


CASES = {"colwise_rowwise": (False, False), "sequence_parallel": (True, False),
         "compiled": (False, True), "compiled_sequence_parallel": (True, True)}
MODES = ("strict", "fused")
NAMES = [f"{mode}:{case}" for mode in MODES for case in CASES
         if not CASES[case][1] or mode == "fused"]


def run_all() -> dict:
    dist.init_process_group("pjrt", timeout=timedelta(seconds=60))
    results = dict.fromkeys(NAMES, "not run: an earlier case raised")
    want = _reference()
    try:
        for name in NAMES:
            mode, case = name.split(":")
            with torch_pjrt.set_eager_mode(mode):
                results[name] = _compare(_tp(*CASES[case]), want) or "ok"
    except Exception:  # noqa: BLE001 - reported as that case's outcome
        results[name] = traceback.format_exc(limit=-10)
        return results
    m = torch_pjrt.metrics()
    results["cpu_fallbacks"] = str(m["cpu_fallbacks"])
    results["compile_eager_graphs"] = m.get("compile_eager_graphs", 0)
    dist.destroy_process_group()
    return results
