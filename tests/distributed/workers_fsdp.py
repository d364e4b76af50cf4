"""Rank code of test_fsdp.py: FSDP2 (fully_shard) on pjrt against one CPU process on the
global batch (float32) and against the same FSDP2 run on CPU tensors over gloo (mixed
precision)."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import torch_pjrt

TOL = 2e-5


class Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, d: int = 16, layers: int = 2):
        super().__init__()
        self.embed = torch.nn.Linear(6, d)
        self.layers = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _batch(step: int):
    g = torch.Generator().manual_seed(200 + step)
    return torch.randn(8, 5, 6, generator=g), torch.randn(8, 5, 3, generator=g)


def _reference(steps: int):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x, y = _batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def _train(device: str, steps: int, compiled: bool = False, divide: float | None = None,
           **shard_kwargs):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    if not isinstance(shard_kwargs.get("offload_policy"), CPUOffloadPolicy):
        model = model.to(device)
    mesh = init_device_mesh(device, (n,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **shard_kwargs)
    fully_shard(model, mesh=mesh, **shard_kwargs)
    scale = 1.0
    if divide is not None:  # a factor other than the group size: PREMUL_SUM(1 / divide)
        model.set_gradient_divide_factor(divide)
        scale = divide / n  # so that the gradients are the global batch's again
    run = torch.compile(model, backend="pjrt") if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x, y = _batch(step)
        rows = slice(rank * 8 // n, (rank + 1) * 8 // n)
        x, y = x[rows].to(device), y[rows].to(device)
        loss = torch.nn.functional.mse_loss(run(x), y)
        opt.zero_grad()
        (loss * scale).backward()
        opt.step()
        total = loss.detach().float()
        dist.all_reduce(total)
        losses.append(total.item() / n)
    full = {k: v.full_tensor().detach().cpu().float() for k, v in model.state_dict().items()}
    return losses, full


def _compare(got, want, tol: float) -> str | None:
    (losses, params), (ref_losses, ref_params) = got, want
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        if abs(a - b) > tol * max(1.0, abs(b)):
            return f"loss of step {i}: {a} vs {b}"
    for k in ref_params:
        diff = (params[k] - ref_params[k].float()).abs().max().item()
        if diff > tol * 10:
            return f"parameter {k} differs by {diff}"
    return None


STEPS = 3
BF16 = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                           reduce_dtype=torch.float32))
CASES = {
    # name: (fully_shard arguments, reference: "global" batch on CPU or "gloo" FSDP2 on CPU)
    "reshard_after_forward": (dict(reshard_after_forward=True), "global"),
    "keep_after_forward": (dict(reshard_after_forward=False), "global"),
    "premul_sum": (dict(divide=4.0), "global"),
    "bf16_params_fp32_reduce": (BF16, "gloo"),
    "cpu_offload": (dict(offload_policy=CPUOffloadPolicy()), "global"),
    "compiled": (dict(compiled=True), "global"),
}
MODES = ("strict", "fused")
NAMES = [f"{mode}:{case}" for mode in MODES for case in CASES
         if case != "compiled" or mode == "fused"]  # compiled graphs run alone in any mode


def _record_reduce_ops(seen: set) -> None:
    """Note the reduce op of every reduce-scatter the pjrt group runs."""
    from torch_pjrt.distributed import process_group

    cls = process_group.ProcessGroupPjrt
    original = cls._reduce_scatter

    def noted(self, name, outputs, inputs, opts):
        seen.add(process_group._op(opts.reduceOp)[0])
        return original(self, name, outputs, inputs, opts)

    cls._reduce_scatter = noted


def run_all() -> dict:
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timedelta(seconds=60))
    reduce_ops: set = set()
    _record_reduce_ops(reduce_ops)
    results = dict.fromkeys(NAMES, "not run: an earlier case raised")
    global_ref = _reference(STEPS)
    gloo_refs = {}
    try:
        for mode in MODES:
            with torch_pjrt.set_eager_mode(mode):
                for case, (kw, ref) in CASES.items():
                    if f"{mode}:{case}" not in results:
                        continue
                    if ref == "gloo":
                        if case not in gloo_refs:
                            gloo_refs[case] = _train("cpu", STEPS, **kw)
                        want, tol = gloo_refs[case], 2e-2
                    else:
                        want, tol = global_ref, TOL
                    got = _train("pjrt", STEPS, **kw)
                    results[f"{mode}:{case}"] = _compare(got, want, tol) or "ok"
    except Exception:  # noqa: BLE001 - reported as that case's outcome
        results[f"{mode}:{case}"] = traceback.format_exc(limit=-10)
        return results
    results["cpu_fallbacks"] = str(torch_pjrt.metrics()["cpu_fallbacks"])
    results["reduce_ops"] = sorted(reduce_ops)
    dist.destroy_process_group()
    return results
