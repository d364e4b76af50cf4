"""A step's host inputs on the device in one copy: each host-to-device copy costs a fixed
0.1-1 ms on the host (measured, docs/serving.md), a step has up to seven small ones."""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEVICE = torch.device("pjrt")


def to_device(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The host integer tensors on the device: packed into one int32 buffer, copied once,
    returned as views of it (shapes kept, dtype int32; a view costs no operation, the
    step's program reads its slice of the buffer). Values must fit in int32."""
    flat = torch.cat([t.reshape(-1).to(torch.int32) for t in tensors])
    buffer = flat.to(DEVICE, non_blocking=True)
    out, at = [], 0
    for t in tensors:
        out.append(buffer[at: at + t.numel()].view(t.shape))
        at += t.numel()
    return out
