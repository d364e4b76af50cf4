"""Every compile test starts from a fresh Dynamo cache and zeroed counters."""

import pytest
import torch

import torch_pjrt


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch_pjrt.counters.reset()
    yield
    torch._dynamo.reset()
