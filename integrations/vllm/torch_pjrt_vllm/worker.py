"""vLLM's worker on pjrt: the device, the process group, the KV cache's size, the warm-up."""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from . import (
    attention,
    moe,  # noqa: F401 - registers the MoE layers of pjrt
)
from .buckets import page_buckets, token_buckets
from .model_runner import PjrtModelRunner

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures its handlers


class PjrtWorker(Worker):
    def __init__(self, vllm_config: VllmConfig, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False) -> None:
        _describe_job(vllm_config.parallel_config.world_size, rank, local_rank,
                      distributed_init_method)
        # Serving runs the programs the warm-up compiled, so tiered execution (a first
        # use runs op by op while its program compiles in the background) has nothing to
        # save here; on, it left programs (a loop's whole step) to compile during serving
        # (docs/serving.md). Read when the pjrt runtime starts, at the first device use.
        os.environ.setdefault("TORCH_PJRT_TIERED", "0")
        # A step is one flush with no loop in it (the logits are read every step), but its
        # decoder layers repeat: loop cutting (eager/loops.py) would run each layer as a
        # program of its own, one launch per layer per step. One program per step instead.
        os.environ.setdefault("TORCH_PJRT_FUSED_LOOPS", "0")
        super().__init__(vllm_config, local_rank, rank, distributed_init_method,
                         is_driver_worker=is_driver_worker)
        self.parallel_config.disable_custom_all_reduce = True

    def init_device(self) -> None:
        from vllm.platforms import current_platform

        # the runner's own tensors are the host's (vLLM's CPU runner); the model's, pjrt's
        self.device = torch.device("cpu")
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method, self.local_rank,
                                            current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        self.model_runner = PjrtModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no sleep-mode allocator on pjrt

    def sleep(self, level: int = 1) -> None:
        logger.warning("pjrt: sleep mode is not supported, ignored")

    def wake_up(self, tags: list[str] | None = None) -> None:
        logger.warning("pjrt: sleep mode is not supported, ignored")

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: `kv_cache_memory_bytes` where given, else
        `gpu_memory_utilization` of the device's memory less what the weights hold."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        from vllm.platforms import current_platform

        total = current_platform.get_device_total_memory()
        used = torch.pjrt.memory_allocated()
        available = int(total * self.cache_config.gpu_memory_utilization) - used
        if available <= 0:
            raise ValueError(f"pjrt: no device memory left for the KV cache ({used} bytes "
                             f"used of {total}); lower the model or set "
                             "--kv-cache-memory-bytes")
        return available

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Runs one step of every token bucket (and the sampler), so that serving compiles
        nothing: the programs come from the compile cache on a warm start. Each step's
        fused programs are compiled (or loaded) here, where tiered execution is off (as
        the worker sets it): a warm-up step runs once, and with tiering on its programs
        would compile during serving."""
        import torch_pjrt
        from torch_pjrt.eager import tiers

        start, before = time.perf_counter(), torch_pjrt.metrics().get("compiles", 0)
        with warnings.catch_warnings():
            # each bucket is meant to be one more program of the same step's graph: not
            # the accidental recompiles fused eager warns about
            warnings.filterwarnings("ignore", message=r"pjrt: a fused graph of .* has been "
                                    r"compiled for")
            self._warm_up_steps()
        if not tiers.blocking():
            logger.warning("pjrt: tiered execution is on (TORCH_PJRT_TIERED): the warm-up "
                           "steps ran op by op and their programs compile while serving")
        self.warmup_seconds = time.perf_counter() - start
        self.warmup_compiles = torch_pjrt.metrics().get("compiles", 0) - before
        logger.info("pjrt warm-up: %d step shapes, %d compiles, %.1f s", self.warmup_steps,
                    self.warmup_compiles, self.warmup_seconds)
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=self.warmup_seconds, encoder=0.0)

    def _warm_up_steps(self) -> None:
        """One step of every prefill and decode bucket, each with the sampler."""
        runner = self.model_runner
        limit = self.scheduler_config.max_num_batched_tokens
        for size in token_buckets(limit):  # prefill and mixed steps
            hidden, last = runner._dummy_run(min(size, limit), force_attention=True,
                                             skip_eplb=True)
            runner._dummy_sampler_run(last)
        seqs = min(self.scheduler_config.max_num_seqs, limit)
        width = -(-self.model_config.max_model_len // self.cache_config.block_size)
        for size in token_buckets(seqs):  # decode steps: one token a request
            for pages in page_buckets(width):
                attention.warmup_pages = pages
                try:
                    hidden, last = runner._dummy_run(min(size, seqs), force_attention=True,
                                                     uniform_decode=True, skip_eplb=True)
                finally:
                    attention.warmup_pages = None
                runner._dummy_sampler_run(last)
        torch.pjrt.synchronize()
        self.warmup_steps = len(token_buckets(limit)) + (len(token_buckets(seqs))
                                                         * len(page_buckets(width)))


def _describe_job(world_size: int, rank: int, local_rank: int, init_method: str) -> None:
    """torchrun's variables for a worker of several: the pjrt runtime joins every process
    of the job when it starts (at the first device query, before vLLM makes its groups),
    from RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT (docs/distributed.md)."""
    if world_size == 1:
        return
    if not init_method.startswith("tcp://"):
        # vLLM's workers meet through a FileStore, which has no queues: the pjrt group's
        # agreement check before each collective needs them. vLLM's collectives are the
        # same on every rank by construction; a mismatch would hang instead of raising
        os.environ.setdefault("TORCH_PJRT_DIST_CHECK", "0")
        return  # torch_pjrt starts the runtime from the group's store
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=host, MASTER_PORT=port)
