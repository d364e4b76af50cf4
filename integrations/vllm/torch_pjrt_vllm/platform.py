"""vLLM's Platform for the pjrt device: which worker, attention backend and settings vLLM uses."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures its handlers

# the model and its KV cache on pjrt, the step's bookkeeping and sampling on the host CPU
# with vLLM's CPU runner: the host kernels it calls are the CPU platform's
_HOST = CpuPlatform


class PjrtPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "pjrt"
    device_type: str = "pjrt"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "pjrt"
    # functions vLLM compiles apart from the model (the sampler's) run on host tensors
    simple_compile_backend: str = "eager"
    ray_device_key: str = "pjrt"
    device_control_env_var: str = "TORCH_PJRT_VLLM_VISIBLE_DEVICES"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        import jax

        return f"pjrt:{jax.devices()[device_id].device_kind}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        stats = torch.pjrt.memory_stats(device_id)
        limit = stats.get("bytes_limit") or stats.get("memory_limit")
        if limit:
            return int(limit)
        import psutil

        return psutil.virtual_memory().total

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.pjrt.memory_allocated())

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.pjrt.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.pjrt.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config,
                             num_heads: int | None = None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("pjrt: MLA and sparse attention are not supported; "
                                      "models with standard multi-head attention are")
        if selected_backend is not None:
            logger.info("pjrt: attention backend %s ignored, using PJRT_PAGED",
                        selected_backend)
        return "torch_pjrt_vllm.attention.PjrtAttentionBackend"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return ("vllm.distributed.device_communicators.base_device_communicator."
                "DeviceCommunicatorBase")

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def import_kernels(cls) -> None:
        _HOST.import_kernels()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        _HOST.register_triton_kernel_overrides()

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = 16
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "torch_pjrt_vllm.worker.PjrtWorker"
        if parallel_config.enable_dbo:
            parallel_config.enable_dbo = False
        scheduler_config = vllm_config.scheduler_config
        if os.environ.get("TORCH_PJRT_VLLM_ASYNC", "1") == "0":
            # else vLLM's own choice: on unless asked off or something it runs with rules
            # it out (model_runner.py: the next step launched while the last one runs)
            scheduler_config.async_scheduling = False
        compilation = vllm_config.compilation_config
        # a step is one XLA program already (fused eager, padded to token buckets):
        # no CUDA graphs, and no Dynamo capture on top of vLLM's own model code
        compilation.cudagraph_capture_sizes = []
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.mode = CompilationMode.NONE
        if parallel_config.world_size > 1:
            # workers forked from a process whose PJRT client is up would share it: each
            # worker starts its own, joined to the others' (torch_pjrt.distributed)
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        model_config = vllm_config.model_config
        if model_config is not None and model_config.use_mla:
            raise NotImplementedError("pjrt: MLA models are not supported")
