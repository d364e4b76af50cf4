"""`--tensorboard DIR`: the demo's loss, tokens/s and the backend's metrics (compiles, cache
hits, syncs, memory) as TensorBoard scalars, through torch.utils.tensorboard."""

from __future__ import annotations

import importlib.util
import os

import torch

INSTALL = 'pip install "torch-pjrt[tensorboard]" (or pip install tensorboard)'

# torch_pjrt.metrics() counters logged at each step, under pjrt/
COUNTERS = ("compiles", "recompiles", "cache_hits", "graph_cache_hits", "disk_cache_hits",
            "flushes")


def require() -> None:
    """Exit saying how to install TensorBoard where it is missing (before training)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise SystemExit("torch_pjrt demo: --tensorboard writes with torch.utils.tensorboard, "
                         f"which needs the tensorboard package: {INSTALL}")


class Board:
    """One run's scalars in DIR/<run> (TensorBoard overlays the runs of one DIR)."""

    def __init__(self, logdir: str, run: str, device: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(logdir, run))
        self.pjrt = device.startswith("pjrt")

    def step(self, step: int, loss: float, tokens_per_second: float) -> None:
        w = self.writer
        w.add_scalar("loss/train", loss, step)
        w.add_scalar("throughput/tokens_per_second", tokens_per_second, step)
        if not self.pjrt:
            return
        import torch_pjrt
        from torch_pjrt.runtime import watch

        m = torch_pjrt.metrics()
        for name in COUNTERS:
            w.add_scalar(f"pjrt/{name}", m.get(name, 0), step)
        w.add_scalar("pjrt/compile_seconds", m.get("compile_seconds", 0.0), step)
        w.add_scalar("pjrt/syncs", sum(watch.syncs().values()), step)
        w.add_scalar("pjrt/cpu_fallback_calls", sum(m.get("cpu_fallbacks", {}).values()), step)
        w.add_scalar("memory/allocated_MiB", torch.pjrt.memory_allocated() / 2**20, step)
        w.add_scalar("memory/peak_MiB", torch.pjrt.max_memory_allocated() / 2**20, step)

    def validation(self, step: int, loss: float) -> None:
        self.writer.add_scalar("loss/validation", loss, step)

    def close(self) -> None:
        self.writer.close()
