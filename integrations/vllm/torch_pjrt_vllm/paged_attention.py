"""The paged KV cache's two operators: a PyTorch body each (CPU, the reference), a JAX kernel.

Layout of one layer's cache: `[num_blocks, block_size, 2, num_kv_heads, head_size]`
(slot `s` is block `s // block_size`, row `s % block_size`; index 0 of the third axis the
key, 1 the value). The operators take padded, fixed-size inputs so that one program serves
every step of a size bucket:

- `write_kv(kv_cache, key, value, slot_mapping)` writes token `t`'s key and value at slot
  `slot_mapping[t]`; a slot outside the cache (the padding's) writes nothing.
- `ragged_paged_attention(query, kv_cache, block_table, query_start_loc, seq_lens, scale,
  max_query_len)`: request `r` owns the query rows `query_start_loc[r]:query_start_loc[r + 1]`
  (at most `max_query_len` of them), the last rows of its `seq_lens[r]` positions; each row
  attends causally to the request's cached keys `0..position`, which its first
  `block_table.shape[1]` pages hold. Rows no request owns give zeros. Requests past the
  real ones have no rows (`query_start_loc` repeats its last value).
"""

from __future__ import annotations

import torch

_NS = "torch_pjrt_vllm"


@torch.library.custom_op(f"{_NS}::write_kv", mutates_args=("kv_cache",))
def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Writes key and value [tokens, kv_heads, head_size] at their slots of the cache."""
    flat = kv_cache.view(-1, *kv_cache.shape[2:])
    keep = (slot_mapping >= 0) & (slot_mapping < flat.shape[0])
    slots = slot_mapping[keep].long()
    flat[slots, 0] = key[keep].to(flat.dtype)
    flat[slots, 1] = value[keep].to(flat.dtype)


@torch.library.custom_op(f"{_NS}::ragged_paged_attention", mutates_args=())
def ragged_paged_attention(query: torch.Tensor, kv_cache: torch.Tensor,
                           block_table: torch.Tensor, query_start_loc: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float,
                           max_query_len: int) -> torch.Tensor:
    """Causal attention of each request's query rows over its paged keys and values."""
    tokens, heads, head_size = query.shape
    block_size, kv_heads = kv_cache.shape[1], kv_cache.shape[3]
    out = torch.zeros_like(query)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for r, seq_len in enumerate(lens):
        q_rows = starts[r + 1] - starts[r]
        if q_rows == 0:
            continue
        if q_rows > max_query_len or seq_len > block_table.shape[1] * block_size:
            raise ValueError(f"ragged_paged_attention: request {r} has {q_rows} query rows "
                             f"(at most {max_query_len}) and {seq_len} positions (its "
                             f"table holds {block_table.shape[1] * block_size})")
        blocks = block_table[r, : (seq_len + block_size - 1) // block_size].long()
        kv = kv_cache[blocks].reshape(-1, 2, kv_heads, head_size)[:seq_len].float()
        k = kv[:, 0].repeat_interleave(heads // kv_heads, dim=1)  # [seq, heads, d]
        v = kv[:, 1].repeat_interleave(heads // kv_heads, dim=1)
        q = query[starts[r]:starts[r + 1]].float()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        pos = torch.arange(seq_len - q_rows, seq_len)[:, None]
        scores = scores.masked_fill(torch.arange(seq_len)[None, :] > pos, float("-inf"))
        out[starts[r]:starts[r + 1]] = torch.einsum(
            "hqk,khd->qhd", scores.softmax(-1), v).to(query.dtype)
    return out


@ragged_paged_attention.register_fake
def _(query, kv_cache, block_table, query_start_loc, seq_lens, scale, max_query_len):
    return torch.empty_like(query)


def _write_kv_jax(kv_cache, key, value, slot_mapping):
    import jax.numpy as jnp

    num_blocks, block_size = kv_cache.shape[:2]
    flat = kv_cache.reshape(num_blocks * block_size, *kv_cache.shape[2:])
    rows = jnp.stack([key, value], axis=1).astype(flat.dtype)
    # padding slots lie outside the cache: negative ones are moved past its end, all dropped
    slots = jnp.where(slot_mapping < 0, flat.shape[0], slot_mapping)
    return (flat.at[slots].set(rows, mode="drop").reshape(kv_cache.shape),)


# query rows are attended in blocks of this many rows of one request (at most 16): a step's
# T rows take at most T / QUERY_BLOCK + requests blocks, each over its request's pages
QUERY_BLOCK = 16


def _query_blocks(query_start_loc, tokens: int, max_query_len: int):
    """Each request's query rows cut into blocks of `size` rows: (size, the request of each
    block [NB], the offset of its first row within the request [NB], which blocks are real
    [NB]). A decode step (one row a request) is one block of one row a request."""
    import jax.numpy as jnp

    requests = query_start_loc.shape[0] - 1
    size = max(1, min(max_query_len, tokens, QUERY_BLOCK))
    count = requests if max_query_len <= size else tokens // size + requests
    q_len = query_start_loc[1:] - query_start_loc[:-1]
    blocks = (q_len + size - 1) // size  # [R]
    ends = jnp.cumsum(blocks)
    j = jnp.arange(count)
    request = jnp.sum(ends[None, :] <= j[:, None], axis=1)  # [NB]; R past the last block
    real = request < requests
    request = jnp.minimum(request, requests - 1)
    offset = (j - (ends[request] - blocks[request])) * size
    return size, request, offset, real


def _ragged_paged_attention_jax(query, kv_cache, block_table, query_start_loc, seq_lens,
                                scale, max_query_len):
    """On XLA:CPU with float32 caches, the shim's kernel, which reads each page where the
    cache holds it (torch_pjrt.runtime.cpu_kernels.paged_attention); elsewhere, and with
    TORCH_PJRT_CPU_KERNELS=0, the pure-XLA form below."""
    from torch_pjrt.runtime import cpu_kernels

    if cpu_kernels.paged_attention_applies(query, kv_cache, block_table):
        return cpu_kernels.paged_attention(query, kv_cache, block_table, query_start_loc,
                                           seq_lens, scale, max_query_len)
    return _ragged_paged_attention_xla(query, kv_cache, block_table, query_start_loc,
                                       seq_lens, scale, max_query_len)


def _ragged_paged_attention_xla(query, kv_cache, block_table, query_start_loc, seq_lens,
                                scale, max_query_len):
    """Each request's rows cut into blocks of QUERY_BLOCK rows (one row in a decode step),
    each block gathered with its request's pages into [blocks, rows, ...] and
    [blocks, pages * block_size, ...]; masked softmax in float32. A prefill step of T rows
    attends (T / QUERY_BLOCK + requests) blocks, not a block of T rows for every request."""
    import jax
    import jax.numpy as jnp

    tokens, heads, head_size = query.shape
    block_size, kv_heads = kv_cache.shape[1], kv_cache.shape[3]
    pages = block_table.shape[1]
    groups = heads // kv_heads
    rows, request, offset, real = _query_blocks(query_start_loc, tokens, max_query_len)
    count = request.shape[0]
    q_len = (query_start_loc[1:] - query_start_loc[:-1])[request]  # [NB]
    local = offset[:, None] + jnp.arange(rows)[None, :]  # [NB, Q] row within the request
    valid = real[:, None] & (local < q_len[:, None])
    row = query_start_loc[request][:, None] + local  # [NB, Q] flat row of each query
    pos = (seq_lens[request] - q_len)[:, None] + local  # [NB, Q] position of each query
    q = query[jnp.where(valid, row, 0)].astype(jnp.float32)  # [NB, Q, H, D]
    q = q.reshape(count, rows, kv_heads, groups, head_size)
    # keys and values gathered apart, each page's rows contiguous: one gather of [k, v]
    # pairs then two strided slices cost XLA:CPU two transposing copies more (25-35% of
    # a decode step's attention at 128-512 positions, the same values)
    pages_of = block_table[request]  # [NB, P]
    k = jnp.take(kv_cache[:, :, 0], pages_of, axis=0, mode="fill")
    v = jnp.take(kv_cache[:, :, 1], pages_of, axis=0, mode="fill")
    k = k.reshape(count, pages * block_size, kv_heads, head_size).astype(jnp.float32)
    v = v.reshape(count, pages * block_size, kv_heads, head_size).astype(jnp.float32)
    # keys as the left operand in their gathered layout [L, D]: the query is the operand
    # transposed, which is small
    scores = jax.lax.dot_general(k, q, (((3,), (4,)), ((0, 2), (0, 2)))) * scale
    # [NB, kvh, L, Q, g]
    key_pos = jnp.arange(pages * block_size)
    mask = (key_pos[None, :, None] <= pos[:, None, :]) & valid[:, None, :]  # [NB, L, Q]
    scores = jnp.where(mask[:, None, :, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=2)
    out = jax.lax.dot_general(probs, v, (((2,), (1,)), ((0, 1), (0, 2))))  # [NB, kvh, Q, g, D]
    out = out.transpose(0, 2, 1, 3, 4).reshape(count, rows, heads, head_size)
    target = jnp.where(valid, row, tokens)  # rows no request owns are dropped
    result = jnp.zeros((tokens, heads, head_size), jnp.float32)
    return result.at[target].set(out, mode="drop").astype(query.dtype)


def _register() -> None:
    from torch_pjrt.kernels import register_jax

    register_jax(write_kv, _write_kv_jax)
    register_jax(ragged_paged_attention, _ragged_paged_attention_jax, vjp_autograd=False)


_register()
