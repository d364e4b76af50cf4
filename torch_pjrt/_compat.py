"""Every difference between the torch (and JAX) releases torch-pjrt supports, in one place:
each a small named function or constant with the reason it exists (docs/compatibility.md)."""

from __future__ import annotations

import torch
from torch._ops import OpOverload

_aten = torch.ops.aten


def torch_release() -> tuple[int, int]:
    """(major, minor) of the installed torch, for the choices below only."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def aten_overloads(*names: str) -> list[OpOverload]:
    """The overloads ("op.overload") this torch has, leaving out those a release removed:
    aten::cholesky (torch.cholesky, deprecated since 1.9 for torch.linalg.cholesky) is gone
    from torch 2.14 on. A lowering of such an op registers where the op exists."""
    found = []
    for name in names:
        op, _, overload = name.partition(".")
        packet = getattr(_aten, op, None)
        if packet is not None and overload in packet.overloads():
            found.append(getattr(packet, overload))
    return found
