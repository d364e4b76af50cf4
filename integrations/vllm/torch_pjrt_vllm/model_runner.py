"""vLLM's model runner on pjrt: vLLM's CPU runner for the step's bookkeeping and sampling
on the host; the model, its KV cache and its logits on the device, one program per step.

With vLLM's async scheduling (on by default; `--no-async-scheduling` or
TORCH_PJRT_VLLM_ASYNC=0 turn it off) a greedy step's tokens are the argmax of its logits
in the step's own program: they stay on the device, the next step's input ids take them
there, and the host reads them (PjrtAsyncOutput) while the next step runs, as vLLM's GPU
runner does with its copy stream. Other sampling reads the logits and samples on the host.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput, SamplerOutput
from vllm.v1.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from torch_pjrt.eager import replay
from torch_pjrt.eager.dispatch import to_cpu_own

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
    logits of these rows, where known; each of the two a pair (logits, their argmax or
    None: async scheduling's greedy tokens, computed in the step's program)."""

    def __init__(self, tensor: torch.Tensor | None, rows: int, max_num_seqs: int,
                 sampled: tuple[torch.Tensor, torch.Tensor] | None = None,
                 sampled_logits: tuple | None = None,
                 logits: tuple | None = None, source: tuple | None = None) -> None:
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


def _on_device(t: torch.Tensor) -> bool:
    """Whether `t` is a pjrt tensor (of any index: DEVICE names none)."""
    return t.device.type == DEVICE.type


def _padded(values: torch.Tensor | None, size: int) -> torch.Tensor | None:
    """A host tensor padded with zeros to `size` rows (a device tensor as it is)."""
    if values is None or _on_device(values):
        return values
    padded = values.new_zeros((size, *values.shape[1:]))
    padded[: values.shape[0]] = values
    return padded


class PjrtModelRunner(CPUModelRunner):
    """The CPU runner's host buffers and sampler, with the device's model: inputs padded to
    the token bucket and moved to the device, hidden states and logits computed there, the
    logits read back once per step (the sampler's input: the one host sync)."""

    def __init__(self, vllm_config, device: torch.device) -> None:
        # async scheduling's event on the host's input buffers: each step's inputs go to
        # the device from a new buffer (transfer.py), there is nothing to wait for
        cuda_event = torch.cuda.Event
        torch.cuda.Event = _NoEvent
        try:
            super().__init__(vllm_config, device)
        finally:
            torch.cuda.Event = cuda_event
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

        def step_logits(hidden: DeviceRows | torch.Tensor) -> torch.Tensor:
            """The logits of the rows vLLM samples: read to the host (the host sampler's
            input), or left on the device with their argmax (async scheduling)."""
            if isinstance(hidden, DeviceRows):
                logits, argmax = hidden.logits if hidden.logits is not None else \
                    (compute_logits(hidden.tensor), None)
                rows = hidden.rows
            else:
                logits, argmax = compute_logits(hidden.to(DEVICE)), None
                rows = logits.shape[0]
            if not self.use_async_scheduling:
                return logits.cpu()[:rows]
            rows_of = logits[:rows]
            self._logits_argmax = (rows_of, argmax, logits)  # argmax: padded, where known
            return rows_of

        model.compute_logits = step_logits
        model.register_forward_pre_hook(self._inputs_to_device, with_kwargs=True)
        model.register_forward_hook(self._rows_of_output)
        forward = model.forward

        def converted_forward(**kwargs):
            if self._step_tokens is not None:  # the last step's tokens, on the device
                tokens, rows = self._step_tokens, self._prev_rows
                ids = kwargs["input_ids"]
                taken = tokens[rows.clamp(min=0).long()].to(ids.dtype)
                kwargs["input_ids"] = torch.where(rows >= 0, taken, ids)
            for name, dtype in self._converted.items():  # in the step's graph
                kwargs[name] = kwargs[name].to(dtype)
            return forward(**kwargs)

        def replayed_forward(**kwargs):
            return self._replayed(converted_forward, compute_logits, kwargs)

        model.forward = replayed_forward
        self._replays: dict[tuple, Any] = {}
        self._replay_counts: dict[tuple, int] = {}
        self._converted: dict[str, torch.dtype] = {}
        self._step_logits: tuple | None = None
        self._logits_argmax: tuple | None = None
        # async scheduling: a step's tokens stay on the device, padded to the widest
        # request bucket (so that the next step's program depends on no batch size):
        # (the tokens vLLM holds, [rows, 1], and the padded tensor they are a view of)
        self._tokens_width = token_bucket(self.max_num_reqs)
        self._sampled_full: tuple[torch.Tensor, torch.Tensor] | None = None
        self._no_tokens: torch.Tensor | None = None
        # the next step's (padded last tokens, for each of its input rows the row of those
        # whose token it takes or -1), set by _prepare_input_ids; the rows sent, and the
        # tokens the step's forward reads (every async step takes them: one program a size)
        self._prev_tokens: tuple[torch.Tensor, np.ndarray] | None = None
        self._prev_rows: torch.Tensor | None = None
        self._step_tokens: torch.Tensor | None = None

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
        if self._step_tokens is not None:
            args += [self._step_tokens, self._prev_rows]
        argmax = self.use_async_scheduling
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
                logits = compute_logits(hidden[sampled])
                return (hidden, logits, self._padded_tokens(logits.argmax(-1))) if argmax \
                    else (hidden, logits)

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
            self._step_logits = (results[1], results[2] if len(results) > 2 else None)
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
                 if kwargs.get(n) is not None and not _on_device(kwargs[n])]
        host = [_padded(kwargs[n], size) for n in names]
        metadata = _step_metadata()
        sampled = metadata[0].sampled_rows() if metadata else None
        parts = host + [t for m in metadata for t in m.host]
        parts += [sampled] if sampled is not None else []
        prev_rows, self._step_tokens = None, None
        if self.use_async_scheduling and "input_ids" in names:
            if self._no_tokens is None:
                self._no_tokens = torch.zeros(self._tokens_width, dtype=torch.int64,
                                              device=DEVICE)
            tokens, rows = self._prev_tokens or (self._no_tokens, np.empty(0, np.int32))
            prev_rows = torch.full((size,), -1, dtype=torch.int32)
            prev_rows[: len(rows)] = torch.from_numpy(rows)
            parts.append(prev_rows)
            self._step_tokens = tokens
        elif self._prev_tokens is not None:
            raise RuntimeError("pjrt runner: the last step's tokens are on the device but "
                               "the step's input ids are not on the host")
        self._prev_tokens = None
        if not parts:
            self._sampled = None
            return args, kwargs
        sent = to_device(parts)
        if prev_rows is not None:
            self._prev_rows = sent.pop()
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

    # ------------------------------------------------------------ async scheduling
    def _padded_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens [rows] padded with zeros to the widest request bucket."""
        return torch.nn.functional.pad(tokens, (0, self._tokens_width - tokens.shape[0]))

    def _prepare_input_ids(self, scheduler_output, num_reqs: int,
                           total_num_scheduled_tokens: int, cu_num_tokens: np.ndarray) -> None:
        """The step's input ids on the host, and which of them are the last step's tokens
        still on the device (each request's last row of those that sampled then): the
        forward puts those in on the device (converted_forward), with no host sync."""
        self._prev_tokens = None
        prev = self.input_batch.prev_sampled_token_ids
        if prev is not None and _on_device(prev):
            if scheduler_output.scheduled_spec_decode_tokens or self.enable_prompt_embeds:
                # not taken on the device: read the tokens (a sync) and go vLLM's way
                self.input_batch.prev_sampled_token_ids = _to_host(prev, self._base_of(prev))
            else:
                self.input_ids.copy_to_gpu(total_num_scheduled_tokens)
                prev_positions = self.prev_positions.np[:num_reqs]
                rows = np.full(total_num_scheduled_tokens, -1, dtype=np.int32)
                common = np.nonzero(prev_positions >= 0)[0]
                if common.size:
                    rows[cu_num_tokens[common] - 1] = prev_positions[common]
                    full = self._base_of(prev)
                    self._prev_tokens = (full if full is not None
                                         else self._padded_tokens(prev[:, 0]), rows)
                return
        super()._prepare_input_ids(scheduler_output, num_reqs, total_num_scheduled_tokens,
                                   cu_num_tokens)

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata):
        """Greedy steps whose logits nothing changes: the argmax on the device (the step's
        program computed it where replayed). Other steps: vLLM's sampler on the host."""
        if logits is None or not _on_device(logits):
            return super()._sample(logits, spec_decode_metadata)
        if spec_decode_metadata is None and _argmax_suffices(
                self.input_batch.sampling_metadata):
            self.input_batch.update_async_output_token_ids()
            known, full, _ = self._logits_argmax or (None, None, None)
            if known is not logits or full is None:  # (the step's program did not)
                full = self._padded_tokens(logits.argmax(-1))
            tokens = full[: logits.shape[0]].unsqueeze(-1)
            self._sampled_full = (tokens, full)
            return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)
        return super()._sample(_to_host(logits, self._base_of(logits)), spec_decode_metadata)

    def sample_tokens(self, grammar_output):
        state = self.execute_model_state
        if grammar_output is not None and state is not None and state.logits is not None \
                and _on_device(state.logits):  # the bitmask is applied on the host
            self.execute_model_state = state._replace(
                logits=_to_host(state.logits, self._base_of(state.logits)))
        original = gpu_model_runner.AsyncGPUModelRunnerOutput
        gpu_model_runner.AsyncGPUModelRunnerOutput = PjrtAsyncOutput
        try:
            output = super().sample_tokens(grammar_output)
        finally:
            gpu_model_runner.AsyncGPUModelRunnerOutput = original
            self._logits_argmax = None
        if isinstance(output, PjrtAsyncOutput) and output._sampled is not None:
            output._base = self._base_of(output._sampled)
        return output

    def _base_of(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The padded device tensor `rows` are the first rows of, where the runner made
        them (this step's sampled logits, the last greedy step's tokens), else None."""
        logits = self._logits_argmax
        if logits is not None and logits[0] is rows:
            return logits[2]
        tokens = self._sampled_full
        return tokens[1] if tokens is not None and tokens[0] is rows else None

    def _get_or_create_async_output_copy_stream(self):
        return None  # PjrtAsyncOutput reads the tokens itself

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


def _to_host(t: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """A device tensor read to the host while later steps run (to_cpu_own); a view of a
    dense `base` (the rows of a padded step's tokens or logits: inference mode keeps no
    `_base`) as the base read whole and viewed on the host: reading the view itself would
    compile a copy program for each row count."""
    if base is None or not base.is_contiguous():
        return to_cpu_own(t)
    return to_cpu_own(base).as_strided(t.shape, t.stride(), t.storage_offset())


def _argmax_suffices(metadata) -> bool:
    """Whether a step's tokens are the argmax of its logits as they are: every request
    greedy, and nothing vLLM's sampler applies first (penalties, bad words, allowed tokens,
    logit bias, min_tokens, custom logits processors) or returns besides (logprobs)."""
    if not metadata.all_greedy or metadata.max_num_logprobs is not None or \
            metadata.logprob_token_ids or not metadata.no_penalties or \
            metadata.allowed_token_ids_mask is not None or metadata.bad_words_token_ids:
        return False
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    for processor in metadata.logitsprocs.non_argmax_invariant:
        if isinstance(processor, LogitBiasLogitsProcessor) and not processor.biases:
            continue
        if isinstance(processor, MinTokensLogitsProcessor) and not processor.min_toks:
            continue
        return False
    return True


class _NoEvent:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _CopyDone:
    """vLLM's copy-ready event for PjrtAsyncOutput: synchronize() reads the tokens."""

    def __init__(self, output: PjrtAsyncOutput) -> None:
        self._output = output

    def synchronize(self) -> None:
        self._output._read()


class PjrtAsyncOutput(AsyncModelRunnerOutput):
    """A step's output whose tokens the device is still computing (vLLM's async
    scheduling; built where vLLM's GPU runner builds its own, with the same arguments):
    get_output() reads them, waiting for that step's program only (to_cpu_own), while
    the next step, launched meanwhile, runs on."""

    def __init__(self, model_runner_output: ModelRunnerOutput,
                 sampled_token_ids: torch.Tensor, logprobs_tensors, invalid_req_indices,
                 async_output_copy_stream=None, vocab_size: int = 0,
                 check_ep_fault: bool = False, num_nans: torch.Tensor | None = None) -> None:
        if sampled_token_ids.shape[-1] != 1:
            raise NotImplementedError("pjrt runner: speculative decoding")
        self._output = model_runner_output
        self._invalid = invalid_req_indices
        self._sampled: torch.Tensor | None = sampled_token_ids
        self._base: torch.Tensor | None = None  # what they are a view of (sample_tokens)
        self._logprobs = logprobs_tensors
        self._num_nans = num_nans
        self.sampled_token_ids_cpu = torch.empty(sampled_token_ids.shape,
                                                 dtype=sampled_token_ids.dtype)
        self.async_copy_ready_event = _CopyDone(self)

    def _read(self) -> None:
        if self._sampled is not None:
            sampled, self._sampled = self._sampled, None
            host = sampled if sampled.device.type == "cpu" else _to_host(sampled, self._base)
            with torch.inference_mode():  # (made in the step's inference mode)
                self.sampled_token_ids_cpu.copy_(host)

    def get_output(self) -> ModelRunnerOutput:
        from vllm.v1.worker.gpu_model_runner import nans_to_dict

        self._read()
        tokens = self.sampled_token_ids_cpu.tolist()
        for i in self._invalid:
            tokens[i].clear()
        output = self._output
        output.sampled_token_ids = tokens
        if self._logprobs is not None:
            output.logprobs = self._logprobs.to_cpu_nonblocking().tolists()
        if self._num_nans is not None:
            nans = self._num_nans
            nans = nans if nans.device.type == "cpu" else _to_host(nans)
            output.num_nans_in_logits = nans_to_dict(nans.tolist(), output.req_id_to_index)
        return output


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
