"""vLLM on the pjrt device: the platform plugin's entry point (vLLM calls `register`)."""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.32."


def register() -> str | None:
    """vLLM's `vllm.platform_plugins` entry point: the qualified name of the pjrt platform,
    or None (vLLM's own platform detection) where no pjrt device is available or
    TORCH_PJRT_VLLM=0. `VLLM_PLUGINS=` (empty) also keeps vLLM off this plugin."""
    if os.environ.get("TORCH_PJRT_VLLM", "1") == "0":
        return None
    import vllm

    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        raise RuntimeError(f"torch-pjrt-vllm supports vLLM {SUPPORTED_VLLM}x, found "
                           f"{vllm.__version__}; set TORCH_PJRT_VLLM=0 to run vLLM without it")
    return "torch_pjrt_vllm.platform.PjrtPlatform"
