"""Observability tests count and describe the programs a step runs: each flush runs its
graph's own program here, as in the steady state. (A first flush may run its ops one by one
while that program compiles in the background: docs/compile-cost.md, tested in
tests/eager/test_tiers.py.)"""

import pytest


@pytest.fixture(autouse=True)
def _fused_programs(monkeypatch):
    import torch_pjrt
    from torch_pjrt.eager import tiers

    torch_pjrt.ensure_initialized()  # (first in a process, it reads the settings anew)
    monkeypatch.setattr(tiers, "enabled", False)
