"""Waiting for the device: what torch.pjrt.synchronize() does."""

from __future__ import annotations

from ..lowering import checks
from ..storage import table


def synchronize(device: int | None = None) -> None:
    """Block until every buffer of the device's live storages is computed."""
    for rec in table.live_records():
        if rec.value is not None and (device is None or rec.device == device):
            rec.value.block_until_ready()
    checks.raise_pending()
