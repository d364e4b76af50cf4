"""torch.distributed on pjrt against gloo, 2 processes of this machine: all-reduce bus
bandwidth from 4 KB to 64 MB, the latency of a 4-byte all-reduce, and a DDP training
step against the same processes without gradient sync and against CPU DDP over gloo.

    python bench/distributed.py [--nproc N] [--rounds N] [--smoke] [--print-only]

It starts its processes itself (torch.distributed.run, torchrun's variables). pjrt
tensors go through the `pjrt` process group twice, with the call check on (the default)
and off (TORCH_PJRT_DIST_CHECK=0); CPU tensors through PyTorch's gloo group of the same
processes; and, as the floor under the pjrt group, JAX's own jit(shard_map(psum)) on
global arrays of the same devices. The candidates take turns, round after round, and
each rank starts each measurement at a barrier; rank 0's medians are reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, settle, write_report  # noqa: E402

XLA_ALONE = "XLA alone (jit(shard_map(psum)))"
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _groups() -> dict:
    """The candidates' process groups: pjrt checked, pjrt unchecked, gloo."""
    checked = dist.group.WORLD
    before = os.environ.get("TORCH_PJRT_DIST_CHECK")
    os.environ["TORCH_PJRT_DIST_CHECK"] = "0"
    unchecked = dist.new_group(backend="pjrt")
    if before is None:
        del os.environ["TORCH_PJRT_DIST_CHECK"]
    else:
        os.environ["TORCH_PJRT_DIST_CHECK"] = before
    return {"pjrt": (checked, "pjrt"), "pjrt, check off": (unchecked, "pjrt"),
            "gloo (CPU tensors)": (dist.new_group(backend="gloo"), "cpu")}


def _measure(fns: dict, rounds: int, sync_group) -> dict:
    """Median of each fn's result over `rounds` turns (a fn returning a tuple: the median
    of each of its figures); every rank starts each at a barrier."""
    samples: dict[str, list] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            settle()
            dist.barrier(group=sync_group)
            samples[name].append(fn())
    return {k: tuple(map(statistics.median, zip(*v))) if isinstance(v[0], tuple)
            else statistics.median(v) for k, v in samples.items()}


def _all_reduce_fn(group, device: str, nbytes: int, iters: int, each_sync: bool):
    t = torch.zeros(max(nbytes // 4, 1), device=device)  # zeros: sums stay finite

    def run() -> float:
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
            if each_sync and device != "cpu":
                torch.pjrt.synchronize()
        if device != "cpu":
            torch.pjrt.synchronize()
        return (time.perf_counter() - start) / iters

    run()  # compile, connect
    return run


def _xla_alone_fn(n: int, nbytes: int, iters: int, each_sync: bool):
    """The floor under the pjrt group: JAX's own jit(shard_map(psum)) over the same
    devices, on global arrays, no torch-pjrt code on the way."""
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec

    from torch_pjrt.distributed import collectives

    group = collectives.Group(list(range(n)), dist.get_rank())
    spec = PartitionSpec(collectives.AXIS)
    psum = jax.jit(jax.shard_map(lambda x: lax.psum(x, collectives.AXIS), mesh=group.mesh,
                                 in_specs=spec, out_specs=spec))
    local = jax.device_put(np.zeros(max(nbytes // 4, 1), np.float32), group.device)
    x = jax.make_array_from_single_device_arrays((n * local.shape[0],), group.sharding,
                                                 [local])

    def run() -> float:
        start = time.perf_counter()
        out = None
        for _ in range(iters):
            out = psum(x)
            if each_sync:
                out.block_until_ready()
        out.block_until_ready()
        return (time.perf_counter() - start) / iters

    run()
    return run


def bandwidth(groups: dict, sizes: list[int], rounds: int, n: int, sync) -> dict:
    out = {}
    for size in sizes:
        iters = max(2, min(50, (32 << 20) // size))
        fns = {name: _all_reduce_fn(g, dev, size, iters, False)
               for name, (g, dev) in groups.items()}
        fns[XLA_ALONE] = _xla_alone_fn(n, size, iters, False)
        secs = _measure(fns, rounds, sync)
        # bus bandwidth: what each link carries in a ring all-reduce, per second
        out[size] = {k: size * 2 * (n - 1) / n / s / 1e9 for k, s in secs.items()}
    return out


def latency(groups: dict, rounds: int, sync, iters: int, n: int) -> dict:
    fns = {name: _all_reduce_fn(g, dev, 4, iters, True) for name, (g, dev) in groups.items()}
    fns[XLA_ALONE] = _xla_alone_fn(n, 4, iters, True)
    return _measure(fns, rounds, sync)


def ddp_step(groups: dict, rounds: int, steps: int, sync) -> dict:
    """Seconds per step of the demo GPT (global batch 16, seq 64) under DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_pjrt
    from torch_pjrt.demo.model import GPT, GPTConfig

    cfg = GPTConfig(vocab=256, seq_len=64, layers=2, d_model=128, heads=4)
    rank, n = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 256, (16 // n, 64), generator=gen)
    y = torch.randint(0, 256, (16 // n, 64), generator=gen)

    def trainer(device: str, group, no_sync: bool):
        torch.manual_seed(0)
        ddp = DDP(GPT(cfg).to(device), process_group=group)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        xd, yd = x.to(device), y.to(device)

        def step():
            with ddp.no_sync() if no_sync else nullcontext():
                _, loss = ddp(xd, yd)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            return loss.item()

        def run() -> tuple[float, float]:
            """Wall seconds per step, and the process's CPU seconds per step (every
            thread: host, XLA's, autograd's): with as many processes as cores, a step
            cannot take less wall time than its CPU time."""
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step()
            if device == "pjrt":
                torch.pjrt.synchronize()  # the last step's backward and optimizer step
            return ((time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps)

        for _ in range(3):  # warm up: compile
            step()
        return run

    pjrt_group = groups["pjrt"][0]
    with torch_pjrt.set_eager_mode("fused"):
        fns = {
            "pjrt DDP (fused)": trainer("pjrt", pjrt_group, False),
            "pjrt DDP, check off": trainer("pjrt", groups["pjrt, check off"][0], False),
            "pjrt, no gradient sync": trainer("pjrt", pjrt_group, True),
            "CPU DDP over gloo": trainer("cpu", groups["gloo (CPU tensors)"][0], False),
            # what gradient sync costs on this machine with PyTorch's own CPU stack: the
            # reference for the pjrt group's overhead (both share the cores with compute)
            "CPU, no gradient sync": trainer("cpu", groups["gloo (CPU tensors)"][0], True),
        }
        return _measure(fns, rounds, sync)


def worker(args) -> None:
    dist.init_process_group("pjrt")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = _groups()
    sync = groups["gloo (CPU tensors)"][0]
    sizes = SIZES[::3] if args.smoke else SIZES
    rounds = 1 if args.smoke else args.rounds
    bw = bandwidth(groups, sizes, rounds, n, sync)
    lat = latency(groups, rounds, sync, 20 if args.smoke else 200, n)
    step = ddp_step(groups, rounds, 2 if args.smoke else 5, sync)
    if rank == 0:
        _report(args, n, bw, lat, step)
    dist.destroy_process_group()


def _size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def _report(args, n: int, bw: dict, lat: dict, step: dict) -> None:
    rounds = 1 if args.smoke else args.rounds
    names = list(next(iter(bw.values())))
    lines = ["## torch.distributed: collectives and DDP (`python bench/distributed.py`)", "",
             f"{n} processes on this machine, one device each; medians of {rounds} "
             "rounds, candidates taking turns. `pjrt`: the `pjrt` process group on pjrt "
             "tensors (XLA's collectives, gloo underneath on XLA:CPU), with its call check "
             "(the default) and without (`TORCH_PJRT_DIST_CHECK=0`); gloo: PyTorch's gloo "
             "group on CPU tensors; XLA alone: JAX's own `jit(shard_map(psum))` on the same "
             "devices, no torch-pjrt code (the floor under the pjrt group).", "",
             "All-reduce (SUM, float32) bus bandwidth, GB/s (higher is better):", "",
             "| size | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for size, row in bw.items():
        lines.append(f"| {_size(size)} | " + " | ".join(f"{row[k]:.3f}" for k in names) + " |")
    lines += ["", "4-byte all-reduce, ms per call (each call waited for):", "",
              "| " + " | ".join(lat) + " |", "|" + " --- |" * len(lat),
              "| " + " | ".join(f"{v * 1e3:.3f}" for v in lat.values()) + " |", "",
              "DDP training step of the demo GPT (2 layers, d=128, global batch 16, seq 64; "
              "AdamW), ms per step, the ratio to pjrt without gradient sync, and the ratio "
              "to the same device without gradient sync (what the sync costs), and the CPU "
              "time one process spends per step, all its threads (with a process per core, "
              "the floor under ms/step):", "",
              "| candidate | ms/step | ratio | sync overhead | CPU ms/step |",
              "| --- | --- | --- | --- | --- |"]
    base = step["pjrt, no gradient sync"][0]
    for k, (v, cpu) in step.items():
        own = step["CPU, no gradient sync" if k.startswith("CPU") else "pjrt, no gradient sync"][0]
        lines.append(f"| {k} | {v * 1e3:.1f} | {v / base:.2f}x | {v / own:.2f}x "
                     f"| {cpu * 1e3:.1f} |")
    env = environment()
    lines += ["", f"Measured {env['date']} on {env['cpu']} ({env['cpus']} cores, shared with "
              "other engineers' jobs: a loaded machine), torch " + env["torch"] + ", jax "
              + env["jax"] + "."]
    text = "\n".join(lines)
    print(text)
    if not args.print_only and not args.smoke:
        write_report("distributed", {"bandwidth_gbps": {str(k): v for k, v in bw.items()},
                                     "latency_s": lat,
                                     "ddp_step_s": {k: v[0] for k, v in step.items()},
                                     "ddp_step_cpu_s": {k: v[1] for k, v in step.items()},
                                     "env": env}, text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="few sizes, one round (a check)")
    p.add_argument("--print-only", action="store_true", help="do not write the report")
    args = p.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
           os.path.abspath(__file__), *sys.argv[1:]]
    return subprocess.run(cmd, timeout=3600).returncode


if __name__ == "__main__":
    sys.exit(main())
