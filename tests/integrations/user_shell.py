"""The environment of a user's shell for the integration tests' jobs, each a fresh process:
none of the variables torch-pjrt set in this test process (it runs transformers) nor the
tests' XLA_FLAGS."""

from __future__ import annotations

import os

SET_HERE = ("ACCELERATE_TORCH_DEVICE", "USE_HUB_KERNELS", "XLA_FLAGS")


def user_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in SET_HERE and not k.startswith("PYTEST")}
    env.update(extra)
    return env
