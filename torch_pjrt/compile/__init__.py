"""torch.compile support: the "pjrt" Dynamo backend (see backend.py)."""

from __future__ import annotations


def start() -> None:
    """Register the backend once PJRT has started (backend.py is not imported at
    `import torch`)."""
    from . import backend

    backend.register()
