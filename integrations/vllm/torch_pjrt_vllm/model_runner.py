"""vLLM's model runner on pjrt: vLLM's CPU runner for the step's bookkeeping and sampling
on the host; the model, its KV cache and its logits on the device, one program per step."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from torch_pjrt.eager import replay

from .attention import PjrtAttentionBackend, PjrtAttentionMetadata
from .buckets import request_bucket, token_bucket
from .transfer import DEVICE, to_device

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures its handlers

# TORCH_PJRT_VLLM_REPLAY=0: every step records its ops (fused eager) instead of replaying
_REPLAY = os.environ.get("TORCH_PJRT_VLLM_REPLAY", "1") != "0"
# every this many steps of a replayed shape, the step records instead and its graph is
# compared with the replay's: a model whose ops changed is caught, and records from then on
# (0: never)
_RECHECK = int(os.environ.get("TORCH_PJRT_VLLM_REPLAY_CHECK", "64"))


class DeviceRows:
    """The model's hidden states, `rows` real rows of a padded device tensor. vLLM indexes
    them (the rows it samples) and hands the result to `compute_logits`: the indices are
    padded to the step's request bucket, so the sizes of the step's program stay fixed.
    `sampled`: the rows vLLM samples in most steps (each request's last token), on the host
    and on the device (sent with the step's inputs), or None; `sampled_logits`: theirs,
    where the step's program computed them (a replayed step), else None; `logits`: the
    logits of these rows, where known."""

    def __init__(self, tensor: torch.Tensor | None, rows: int, max_num_seqs: int,
                 sampled: tuple[torch.Tensor, torch.Tensor] | None = None,
                 sampled_logits: torch.Tensor | None = None,
                 logits: torch.Tensor | None = None, source: tuple | None = None) -> None:
        self._tensor, self.rows, self.max_num_seqs = tensor, rows, max_num_seqs
        self.sampled, self.sampled_logits, self.logits = sampled, sampled_logits, logits
        self._source = source  # (hidden states, device indices): the rows, gathered if read

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            hidden, index = self._source
            self._tensor = hidden[index]
        return self._tensor

    @property
    def shape(self) -> torch.Size:
        width = (self._source[0] if self._tensor is None else self._tensor).shape[1:]
        return torch.Size((self.rows, *width))

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: Any) -> DeviceRows:
        if isinstance(index, slice):  # a view: no operation (vLLM slices every step)
            start, stop, step = index.indices(self.rows)
            if (start, step) == (0, 1):
                return DeviceRows(self.tensor, stop, self.max_num_seqs, self.sampled,
                                  self.sampled_logits)
            view = self.tensor[start:stop:step]
            return DeviceRows(view, view.shape[0], self.max_num_seqs)
        index = torch.as_tensor(np.asarray(index) if not isinstance(index, torch.Tensor)
                                else index, device="cpu").to(torch.int32).reshape(-1)
        if self.sampled is not None:
            host, device = self.sampled
            if torch.equal(host[: index.numel()], index):
                return DeviceRows(None, index.numel(), self.max_num_seqs,
                                  logits=self.sampled_logits, source=(self.tensor, device))
        size = request_bucket(self.tensor.shape[0], self.max_num_seqs)
        if index.numel() > size:
            size = token_bucket(index.numel())
        padded = torch.zeros(size, dtype=torch.int32)
        padded[: index.numel()] = index
        return DeviceRows(self.tensor[padded.to(DEVICE, non_blocking=True)], index.numel(),
                          self.max_num_seqs)


def _padded(values: torch.Tensor | None, size: int) -> torch.Tensor | None:
    """A host tensor padded with zeros to `size` rows (a device tensor as it is)."""
    if values is None or values.device == DEVICE:
        return values
    padded = values.new_zeros((size, *values.shape[1:]))
    padded[: values.shape[0]] = values
    return padded


class PjrtModelRunner(CPUModelRunner):
    """The CPU runner's host buffers and sampler, with the device's model: inputs padded to
    the token bucket and moved to the device, hidden states and logits computed there, the
    logits read back once per step (the sampler's input: the one host sync)."""

    def __init__(self, vllm_config, device: torch.device) -> None:
        super().__init__(vllm_config, device)
        from vllm.platforms import CpuArchEnum
        from vllm.platforms.cpu import CpuPlatform

        # the sampler runs on host tensors: the CPU platform's sampling, so that a seed
        # draws the tokens it draws on vLLM's CPU platform
        sampler = self.sampler.topk_topp_sampler
        if CpuPlatform.get_cpu_architecture() not in (CpuArchEnum.RISCV, CpuArchEnum.POWERPC):
            sampler.forward = sampler.forward_cpu

    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights)
        model = self.model
        compute_logits = model.compute_logits

        def logits_on_host(hidden: DeviceRows | torch.Tensor) -> torch.Tensor:
            if isinstance(hidden, DeviceRows):
                logits = hidden.logits if hidden.logits is not None else \
                    compute_logits(hidden.tensor)
                return logits.cpu()[: hidden.rows]
            return compute_logits(hidden.to(DEVICE)).cpu()

        model.compute_logits = logits_on_host
        model.register_forward_pre_hook(self._inputs_to_device, with_kwargs=True)
        model.register_forward_hook(self._rows_of_output)
        forward = model.forward

        def converted_forward(**kwargs):
            for name, dtype in self._converted.items():  # in the step's graph
                kwargs[name] = kwargs[name].to(dtype)
            return forward(**kwargs)

        def replayed_forward(**kwargs):
            return self._replayed(converted_forward, compute_logits, kwargs)

        model.forward = replayed_forward
        self._replays: dict[tuple, Any] = {}
        self._replay_counts: dict[tuple, int] = {}
        self._converted: dict[str, torch.dtype] = {}
        self._step_logits: torch.Tensor | None = None

    def _replayed(self, forward, compute_logits, kwargs: dict) -> torch.Tensor:
        """The model's forward on the device inputs of a step (the pre-hook sent them),
        with the logits of the rows vLLM samples in most steps, replayed (eager/replay.py)
        where a step of the same sizes recorded the same graph twice: vLLM's contract for
        CUDA graphs, a step's ops depend on its sizes only, holds for pjrt's recording too;
        replays skip recording the model's ops (most of a decode step's host time). Other
        steps record, as fused eager does; the logits are then recorded when read."""
        self._step_logits = None
        metadata = _step_metadata(sent=True)
        names = [n for n in ("input_ids", "positions", "inputs_embeds")
                 if kwargs.get(n) is not None]
        other = set(kwargs) - {"input_ids", "positions", "inputs_embeds", "intermediate_tensors"}
        # replayed: ids or embeddings, and positions; no model kwargs, no pipeline stage
        if (not _REPLAY or not metadata or other or len(names) != 2 or
                kwargs.get("intermediate_tensors") is not None):
            return forward(**kwargs)
        args = [kwargs[n] for n in names]
        args += [t for m in metadata for t in m.device_tensors()]
        sampled = self._sampled[1] if self._sampled is not None else None
        args += [sampled] if sampled is not None else []
        key = (tuple(names), replay.signature(args), tuple(self._converted.items()),
               tuple((m.tokens, m.max_query_len) for m in metadata))
        found = self._replays.get(key)
        count = self._replay_counts[key] = self._replay_counts.get(key, 0) + 1
        recheck = _RECHECK > 0 and count % _RECHECK == 0
        if isinstance(found, replay.Replay) and not recheck:
            results = found(args)
        else:
            def step():
                hidden = forward(**kwargs)
                if sampled is None:
                    return (hidden,)
                return hidden, compute_logits(hidden[sampled])

            results, captured, why = replay.capture(step, args)
            if captured is None:
                logger.debug("pjrt runner: steps %s are not replayed: %s", key, why)
                self._replays[key] = False
            elif not found:  # first seen, or refused before (a transient refusal)
                self._replays[key] = ("seen", captured)
            elif isinstance(found, tuple):
                self._replays[key] = captured if found[1].same_as(captured) else \
                    ("seen", captured)
            elif not found.same_as(captured):  # a recheck: the step records otherwise now
                logger.warning("pjrt runner: a step of sizes %s recorded another graph than "
                               "its replay (its ops or Python numbers changed); recording "
                               "such steps until two agree again", key[1])
                self._replays[key] = ("seen", captured)
        if len(results) > 1:
            self._step_logits = results[1]
        return results[0]

    def _inputs_to_device(self, module, args, kwargs):
        """The step's inputs, padded to its token bucket, and its attention metadata on
        the device in one copy (transfer.py); float inputs (embeddings) in their own."""
        if args:
            raise RuntimeError("pjrt runner: the model was called with positional arguments")
        self._converted = {}
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        rows = (ids if ids is not None else embeds).shape[0]
        size = token_bucket(rows)
        self._step_rows = rows
        if embeds is not None:
            kwargs["inputs_embeds"] = _padded(embeds, size).to(DEVICE, non_blocking=True)
        names = [n for n in ("input_ids", "positions")
                 if kwargs.get(n) is not None and kwargs[n].device != DEVICE]
        host = [_padded(kwargs[n], size) for n in names]
        metadata = _step_metadata()
        sampled = metadata[0].sampled_rows() if metadata else None
        parts = host + [t for m in metadata for t in m.host]
        parts += [sampled] if sampled is not None else []
        if not parts:
            self._sampled = None
            return args, kwargs
        sent = to_device(parts)
        for name, original, tensor in zip(names, host, sent):
            kwargs[name] = tensor  # int32: the forward converts it (_replayed)
            if original.dtype != torch.int32:
                self._converted[name] = original.dtype
        at = len(names)
        for m in metadata:
            m.set_device(sent[at: at + len(m.host)])
            at += len(m.host)
        self._sampled = (sampled, sent[at]) if sampled is not None else None
        return args, kwargs

    def _rows_of_output(self, module, args, output):
        if not isinstance(output, torch.Tensor):
            raise NotImplementedError("pjrt runner: models whose forward returns "
                                      f"{type(output).__name__} (auxiliary hidden states, "
                                      "pipeline stages) are not supported yet")
        logits, self._step_logits = self._step_logits, None
        return DeviceRows(output, self._step_rows, self.max_num_reqs, self._sampled, logits)

    def _dummy_sampler_run(self, hidden_states):
        # vLLM's profiling of the sampler's memory: the logits suffice on a host sampler
        return self.model.compute_logits(hidden_states)

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        # never read: attention masks every position past a request's own tokens
        pass

    def initialize_kv_cache_tensors(self, kv_cache_config: KVCacheConfig,
                                    kernel_block_sizes: list[int],
                                    kv_cache_allocation_context=None) -> dict[str, torch.Tensor]:
        """One device tensor per layer in paged_attention.py's layout (vLLM's allocator
        makes byte views of one buffer, which the operators do not need)."""
        kv_caches: dict[str, torch.Tensor] = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            for name in tensor.layers:
                group = next(g for g in kv_cache_config.kv_cache_groups
                             if name in g.layer_names)
                spec = group.kv_cache_spec
                if not isinstance(spec, AttentionSpec):
                    raise NotImplementedError(f"pjrt runner: KV cache spec {spec!r}")
                num_blocks = kv_cache_config.num_blocks_of(tensor)
                shape = PjrtAttentionBackend.kv_cache_shape(num_blocks, spec)
                kv_caches[name] = torch.zeros(shape, dtype=spec.dtype, device=DEVICE)
        for name, target in self.shared_kv_cache_layers.items():
            kv_caches[name] = kv_caches[target]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context,
                      self.kv_caches, kv_cache_groups=kv_cache_config.kv_cache_groups)
        torch.pjrt.synchronize()
        return kv_caches


def _step_metadata(sent: bool = False) -> list[PjrtAttentionMetadata]:
    """The step's attention metadata objects, once each (layers of a group share one):
    those not on the device yet, or (`sent`) those already there."""
    if not is_forward_context_available():
        return []
    found = get_forward_context().attn_metadata
    if isinstance(found, list):  # micro-batches: not used on pjrt
        found = {k: v for d in found for k, v in d.items()}
    unique: dict[int, PjrtAttentionMetadata] = {}
    for m in (found or {}).values():
        if isinstance(m, PjrtAttentionMetadata) and (m.slot_mapping is None) != sent:
            unique.setdefault(id(m), m)
    return list(unique.values())
