"""Rank code of test_lightning.py's DDP case (started by tests/distributed/launch.py):
`Trainer(accelerator="pjrt", strategy="pjrt_ddp", devices=2)` in each of two processes."""

from __future__ import annotations

import os
import sys

import lightning.pytorch as pl
import torch

import torch_pjrt.integrations.lightning  # noqa: F401  (registers "pjrt", "pjrt_ddp")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def ddp() -> dict:
    from test_lightning import Classifier, fit  # noqa: F401  (the same module and loop)

    module = fit(accelerator="pjrt", strategy="pjrt_ddp", devices=2, sgd=True)
    assert module.losses[0].device.type == "pjrt"
    return {"losses": [float(x) for x in module.losses],
            "params": {n: p.detach().cpu().tolist() for n, p in module.named_parameters()},
            "rank": pl.utilities.rank_zero.rank_zero_only.rank,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized()
            else None}
