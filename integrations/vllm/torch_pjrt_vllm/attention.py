"""vLLM's attention backend on pjrt: device metadata padded to the step's buckets, the paged
cache written and read by the two operators of paged_attention.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from . import paged_attention  # noqa: F401 - registers torch.ops.torch_pjrt_vllm
from .buckets import page_bucket, request_bucket, token_bucket
from .transfer import to_device

# the warm-up's page bucket for its decode steps (whose requests are short): the
# worker sets it to compile every bucket a decode step can take
warmup_pages: int | None = None


class PjrtAttentionBackend(AttentionBackend):
    # the cache is written inside forward (one operator after the other, in one program)
    forward_includes_kv_cache_update: bool = True
    accept_output_buffer: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[PjrtAttentionImpl]:
        return PjrtAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PjrtAttentionMetadataBuilder]:
        return PjrtAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def kv_cache_shape(num_blocks: int, spec: AttentionSpec) -> tuple[int, ...]:
        """One layer's cache (paged_attention.py's layout)."""
        return (num_blocks, spec.block_size, 2, spec.num_kv_heads, spec.head_size)


@dataclass
class PjrtAttentionMetadata:
    """A step's attention inputs, padded: `tokens` rows, `requests` requests, at most
    `max_query_len` rows a request (1 in a decode step, else `tokens`). Built on the host;
    the runner copies them to the device with the step's other inputs (transfer.py)."""

    num_actual_tokens: int
    tokens: int
    max_query_len: int
    host: tuple[torch.Tensor, ...]  # the four below, on the host
    slot_mapping: torch.Tensor | None = None  # [tokens] int32, -1 for padding
    block_table: torch.Tensor | None = None  # [requests, pages] int32
    query_start_loc: torch.Tensor | None = None  # [requests + 1] int32
    seq_lens: torch.Tensor | None = None  # [requests] int32

    def set_device(self, tensors: list[torch.Tensor]) -> None:
        """The device copies of `host`, in its order."""
        self.slot_mapping, self.block_table, self.query_start_loc, self.seq_lens = tensors

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        return self.slot_mapping, self.block_table, self.query_start_loc, self.seq_lens

    def on_device(self) -> PjrtAttentionMetadata:
        if self.slot_mapping is None:  # not sent with the step's inputs: alone
            self.set_device(to_device(self.host))
        return self

    def sampled_rows(self) -> torch.Tensor:
        """The row of each request's last token, padded to the request bucket (the rows
        vLLM samples when it samples one token a request)."""
        return self.host[2][1:] - 1


def _padded(values: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    out = torch.full((size, *values.shape[1:]), fill, dtype=torch.int32)
    out[: values.shape[0]] = values
    return out


class PjrtAttentionMetadataBuilder(AttentionMetadataBuilder[PjrtAttentionMetadata]):
    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> PjrtAttentionMetadata:
        m = common_attn_metadata
        n, reqs = m.num_actual_tokens, m.num_reqs
        tokens = token_bucket(n)
        requests = request_bucket(n, self.max_num_seqs)
        if reqs > requests:
            raise RuntimeError(f"pjrt attention: {reqs} requests in a step of {n} tokens, "
                               f"more than its bucket's {requests}")
        qsl = m.query_start_loc_cpu[: reqs + 1].to(torch.int32)
        query_start_loc = torch.full((requests + 1,), int(qsl[-1]), dtype=torch.int32)
        query_start_loc[: reqs + 1] = qsl
        table = m.block_table_tensor[:reqs].to("cpu", torch.int32)
        width = table.shape[1]
        if m.max_query_len == 1:  # a decode step: one row a request, the pages it spans
            max_query_len = 1
            pages = (int(m.seq_lens[:reqs].max()) + self.block_size - 1) // self.block_size
            table = table[:, : warmup_pages or page_bucket(pages, width)]
        else:  # prefill and mixed steps: every row, the whole table (one program a bucket)
            max_query_len = tokens
        host = (_padded(m.slot_mapping[:n].to("cpu", torch.int32), tokens, -1),
                _padded(table, requests, 0), query_start_loc,
                _padded(m.seq_lens[:reqs].to("cpu", torch.int32), requests, 0))
        return PjrtAttentionMetadata(n, tokens, max_query_len, host)


class PjrtAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap, "sinks": sinks,
                       "kv_sharing_target_layer_name": kv_sharing_target_layer_name}
        given = [k for k, v in unsupported.items() if v not in (None, 0, 0.0)]
        if given or attn_type != AttentionType.DECODER or kv_cache_dtype != "auto":
            raise NotImplementedError(
                f"pjrt attention: {given or attn_type or kv_cache_dtype} not supported yet "
                "(causal decoder attention with the model's dtype is)")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_sharing_target_layer_name = None

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: PjrtAttentionMetadata | None,
                output: torch.Tensor, output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("pjrt attention: fused output quantization")
        if attn_metadata is None:  # vLLM's profiling run, without a cache
            return output.zero_()
        if query.shape[0] != attn_metadata.tokens:
            raise RuntimeError(f"pjrt attention: {query.shape[0]} query rows, the step's "
                               f"metadata is padded to {attn_metadata.tokens}")
        attn_metadata = attn_metadata.on_device()
        ops = torch.ops.torch_pjrt_vllm
        ops.write_kv(kv_cache, key, value, attn_metadata.slot_mapping)
        out = ops.ragged_paged_attention(query, kv_cache, attn_metadata.block_table,
                                         attn_metadata.query_start_loc,
                                         attn_metadata.seq_lens, self.scale,
                                         attn_metadata.max_query_len)
        output.copy_(out.view(output.shape))
        return output
