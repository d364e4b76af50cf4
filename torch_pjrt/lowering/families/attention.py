"""Scaled dot-product attention: the fused (overrideable) op and its backward, _safe_softmax.

The attention core works on (batch, kv_heads, rows, dim) queries, where the rows
are the query heads sharing a key/value head times the positions, so
grouped-query attention (fewer key/value heads) needs no repeated keys and every
product is one batched matmul. Causal attention splits the queries into blocks
that each meet only the keys they can see. Per block, two strategies, chosen by
the size of its score matrix:

- dense: the scores, softmax and both products as single XLA ops (fastest
  while the scores fit comfortably in memory);
- chunked: keys and values in blocks under `lax.scan` with an online softmax
  (running max and sum), so memory grows with the block, not the key length;
  the backward recomputes each block's probabilities from the logsumexp.

On XLA:CPU, float32 attention without a mask or dropout calls ATen's CPU flash
attention instead (runtime/cpu_kernels.py): native CPU eager's own kernel, so results
match it bit for bit.

Dropout masks come from the op's PRNG key; the forward returns the key's data
as philox_seed/philox_offset, so the backward regenerates the same masks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ...runtime import cpu_kernels
from ...storage import dtypes
from ..registry import lower
from ._ops import aten
from .linalg import precision

# Score matrices with more elements than this are computed block by block: 16 MiB of
# float32 scores (the backward holds about three such), so memory grows linearly with the
# sequence from about 2k tokens on (4 heads); at 1 << 26 it grew 4x per doubling up to 8k
# (bench/attention_memory.py, docs/attention.md).
DENSE_SCORES_LIMIT = 1 << 22
KEY_BLOCK = 512
# Causal attention splits the queries into up to QUERY_BLOCKS blocks of at least
# QUERY_BLOCK_MIN rows; each block only meets the keys it can see (about 5/8 of the
# score matrix for four blocks instead of all of it).
QUERY_BLOCKS = 4
QUERY_BLOCK_MIN = 64


def _acc(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _einsum(spec, a, b):
    return jnp.einsum(spec, a, b, precision=precision(),
                      preferred_element_type=_acc(jnp.result_type(a, b)))


# -------------------------------------------------------------- shapes
class _Layout:
    """How (..., Hq, L, E) inputs map to the core's arrays and back.

    The core sees queries as (B, Hk, R, E), where the R rows are the G query heads
    that share one key/value head times the L positions (G = 1 without grouped-query
    attention), and keys and values as (B, Hk, S, E): every product is one batched
    matmul over (B, Hk), the layout XLA's dot emitters handle best."""

    def __init__(self, q, k):
        self.batch = q.shape[:-3] if q.ndim >= 3 else ()
        self.hq = q.shape[-3] if q.ndim >= 3 else 1
        self.hk = k.shape[-3] if k.ndim >= 3 else 1
        self.b = math.prod(self.batch)
        self.g = self.hq // self.hk
        self.lq, self.s = q.shape[-2], k.shape[-2]

    def query(self, q):
        """(B, Hk, G, L, E): split into query blocks along L, then rows()."""
        return q.reshape(self.b, self.hk, self.g, self.lq, q.shape[-1])

    def kv(self, t):
        return t.reshape(self.b, self.hk, self.s, t.shape[-1])

    @staticmethod
    def rows(t):
        """(B, Hk, G, L, ...) -> (B, Hk, G * L, ...)."""
        return t.reshape(t.shape[:2] + (t.shape[2] * t.shape[3],) + t.shape[4:])

    def bias(self, bias):
        """The bias as (B|1, Hk|1, G|1, L|1, S|1), without broadcasting more than needed."""
        full = self.batch + (self.hq, self.lq, self.s)
        bias = bias.reshape((1,) * (len(full) - bias.ndim) + bias.shape)
        lead = bias.shape[:len(self.batch)]
        if any(d != 1 for d in lead):
            bias = jnp.broadcast_to(bias, self.batch + bias.shape[len(self.batch):])
            b = self.b
        else:
            b = 1
        h, lq, s = bias.shape[-3:]
        heads = (self.hk, self.g) if h != 1 else (1, 1)
        return bias.reshape((b,) + heads + (lq, s))

    @staticmethod
    def bias_rows(bias, g: int):
        """A (B|1, Hk|1, G|1, L|1, S|1) bias block as rows: (B|1, Hk|1, R|1, S|1)."""
        if bias is None:
            return None
        if g > 1 and bias.shape[2:4] != (1, 1):
            bias = jnp.broadcast_to(bias, bias.shape[:2] + (g,) + bias.shape[3:])
        return bias.reshape(bias.shape[:2] + (bias.shape[2] * bias.shape[3], bias.shape[4]))

    def bias_back(self, grad, bias_shape):
        """Sum a (B, Hk, G, L, S) gradient down to the bias's own shape."""
        full = self.batch + (self.hq, self.lq, self.s)
        grad = grad.reshape(full)
        padded = (1,) * (len(full) - len(bias_shape)) + tuple(bias_shape)
        axes = tuple(i for i, (n, m) in enumerate(zip(full, padded)) if m == 1 and n != 1)
        grad = jnp.sum(grad, axis=axes, keepdims=True)
        return grad.reshape(bias_shape)


def _masked_scores(s, bias, causal, q_offset, k_offset, s_valid, lq):
    """Scores with the bias added and the causal / padding masks applied (-inf).
    Row r of the scores is query position q_offset + r % lq."""
    if bias is not None:
        if bias.dtype == jnp.bool_:
            s = jnp.where(bias, s, -jnp.inf)
        else:
            s = s + bias.astype(s.dtype)
    rows, blk = s.shape[-2:]
    if causal or s_valid is not None:
        row = lax.broadcasted_iota(jnp.int32, (rows, blk), 0)
        if rows != lq:
            row = row % lq
        row = row + q_offset
        col = lax.broadcasted_iota(jnp.int32, (rows, blk), 1) + k_offset
        keep = jnp.ones((rows, blk), jnp.bool_)
        if causal:  # PyTorch's causal mask is tril(ones(L, S)): aligned top-left
            keep = keep & (col <= row)
        if s_valid is not None:
            keep = keep & (col < s_valid)
        s = jnp.where(keep, s, -jnp.inf)
    return s


def _dropout_keep(key, p, shape):
    return jax.random.bernoulli(key, 1.0 - p, shape)


# -------------------------------------------------------------- dense
def _dense_forward(q, k, v, bias, causal, scale, p, key, q_offset, lq):
    s = _einsum("bhre,bhse->bhrs", q, k) * scale
    s = _masked_scores(s, bias, causal, q_offset, 0, None, lq)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(s - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    # Rows with every key masked give zeros (and lse -inf), as _safe_softmax does.
    probs = e / jnp.where(total > 0, total, 1)
    lse = jnp.where(total > 0, m + jnp.log(jnp.where(total > 0, total, 1)), -jnp.inf)[..., 0]
    if p > 0:
        probs = jnp.where(_dropout_keep(key, p, probs.shape), probs / (1 - p), 0)
    out = _einsum("bhrs,bhse->bhre", probs.astype(v.dtype), v)
    return out, lse


def _dense_backward(grad, q, k, v, bias, out, lse, causal, scale, p, key, want_bias,
                    q_offset, lq):
    s = _einsum("bhre,bhse->bhrs", q, k) * scale
    s = _masked_scores(s, bias, causal, q_offset, 0, None, lq)
    finite = jnp.isfinite(lse)[..., None]
    probs = jnp.where(finite, jnp.exp(s - jnp.where(finite, lse[..., None], 0)), 0)
    dp = _einsum("bhre,bhse->bhrs", grad, v)
    dropped = probs
    if p > 0:
        keep = _dropout_keep(key, p, probs.shape)
        dropped = jnp.where(keep, probs / (1 - p), 0)
        dp = jnp.where(keep, dp / (1 - p), 0)
    delta = jnp.sum(grad.astype(dp.dtype) * out.astype(dp.dtype), axis=-1, keepdims=True)
    ds = probs * (dp - delta)
    dq = _einsum("bhrs,bhse->bhre", ds, k) * scale
    dk = _einsum("bhrs,bhre->bhse", ds, q) * scale
    dv = _einsum("bhrs,bhre->bhse", dropped, grad)
    return dq, dk, dv, (ds if want_bias else None)


# -------------------------------------------------------------- chunked
def _blocks(t, axis, blk, n_blocks):
    """Split `axis` of `t` (zero-padded) into n_blocks blocks: the leading scan axis."""
    if t.shape[axis] == 1:  # broadcast along this axis: every block sees the same
        return None
    pad = n_blocks * blk - t.shape[axis]
    if pad:
        config = [(0, 0)] * t.ndim
        config[axis] = (0, pad)
        t = jnp.pad(t, config)
    t = t.reshape(t.shape[:axis] + (n_blocks, blk) + t.shape[axis + 1:])
    return jnp.moveaxis(t, axis, 0)


def _key_blocks(k, v, bias):
    """The key axis in blocks of KEY_BLOCK (the last zero-padded): (block size, number of
    blocks, the true length when padded else None, k, v and bias split into blocks)."""
    s_len = k.shape[2]
    blk = min(KEY_BLOCK, s_len)
    n_blocks = -(-s_len // blk)
    s_valid = s_len if n_blocks * blk != s_len else None
    ks, vs = _blocks(k, 2, blk, n_blocks), _blocks(v, 2, blk, n_blocks)
    bias_blocks = None if bias is None else _blocks(bias, 3, blk, n_blocks)
    return blk, n_blocks, s_valid, ks, vs, bias_blocks


def _chunked_forward(q, k, v, bias, causal, scale, p, key, q_offset, lq):
    blk, n_blocks, s_valid, ks, vs, bias_blocks = _key_blocks(k, v, bias)
    acc_t = _acc(q.dtype)
    shape = q.shape[:-1]

    def step(carry, xs):
        m, total, acc = carry
        i, kb, vb = xs[:3]
        bb = bias if bias is not None and bias_blocks is None else (
            xs[3] if bias is not None else None)
        s = _einsum("bhre,bhse->bhrs", q, kb) * scale
        s = _masked_scores(s, bb, causal, q_offset, i * blk, s_valid, lq)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0)
        e = jnp.exp(s - m_safe[..., None])
        rescale = jnp.exp(jnp.where(jnp.isfinite(m), m, 0) - m_safe)
        rescale = jnp.where(jnp.isfinite(m), rescale, 0)
        total = total * rescale + jnp.sum(e, axis=-1)
        if p > 0:
            keep = _dropout_keep(jax.random.fold_in(key, i), p, e.shape)
            e = jnp.where(keep, e / (1 - p), 0)
        acc = acc * rescale[..., None] + _einsum("bhrs,bhse->bhre", e.astype(vb.dtype), vb)
        return (m_new, total, acc), None

    init = (jnp.full(shape, -jnp.inf, acc_t), jnp.zeros(shape, acc_t),
            jnp.zeros(shape + (v.shape[-1],), acc_t))
    xs = (jnp.arange(n_blocks), ks, vs) + ((bias_blocks,) if bias_blocks is not None else ())
    (m, total, acc), _ = lax.scan(step, init, xs)
    nonempty = total > 0
    out = acc / jnp.where(nonempty, total, 1)[..., None]
    m_safe = jnp.where(jnp.isfinite(m), m, 0)
    lse = jnp.where(nonempty, m_safe + jnp.log(jnp.where(nonempty, total, 1)), -jnp.inf)
    return out, lse


def _chunked_backward(grad, q, k, v, bias, out, lse, causal, scale, p, key, want_bias,
                      q_offset, lq):
    blk, n_blocks, s_valid, ks, vs, bias_blocks = _key_blocks(k, v, bias)
    finite = jnp.isfinite(lse)[..., None]
    lse_safe = jnp.where(finite, lse[..., None], 0)
    acc_t = _acc(q.dtype)
    delta = jnp.sum(grad.astype(acc_t) * out.astype(acc_t), axis=-1, keepdims=True)

    def step(dq, xs):
        i, kb, vb = xs[:3]
        bb = bias if bias is not None and bias_blocks is None else (
            xs[3] if bias is not None else None)
        s = _einsum("bhre,bhse->bhrs", q, kb) * scale
        s = _masked_scores(s, bb, causal, q_offset, i * blk, s_valid, lq)
        probs = jnp.where(finite, jnp.exp(s - lse_safe), 0)
        dp = _einsum("bhre,bhse->bhrs", grad, vb)
        dropped = probs
        if p > 0:
            keep = _dropout_keep(jax.random.fold_in(key, i), p, probs.shape)
            dropped = jnp.where(keep, probs / (1 - p), 0)
            dp = jnp.where(keep, dp / (1 - p), 0)
        ds = probs * (dp - delta)
        dq = dq + _einsum("bhrs,bhse->bhre", ds, kb) * scale
        dk = _einsum("bhrs,bhre->bhse", ds, q) * scale
        dv = _einsum("bhrs,bhre->bhse", dropped, grad)
        return dq, (dk, dv, ds if want_bias else None)

    xs = (jnp.arange(n_blocks), ks, vs) + ((bias_blocks,) if bias_blocks is not None else ())
    dq, (dks, dvs, dss) = lax.scan(step, jnp.zeros(q.shape, acc_t), xs)

    def unblock(t, axis):  # (n_blocks, ..., blk, ...) -> (..., S, ...)
        t = jnp.moveaxis(t, 0, axis)
        t = t.reshape(t.shape[:axis] + (n_blocks * blk,) + t.shape[axis + 2:])
        return lax.slice_in_dim(t, 0, k.shape[2], axis=axis)

    ds = unblock(dss, 3) if want_bias else None
    return dq, unblock(dks, 2), unblock(dvs, 2), ds


# -------------------------------------------------------------- query blocks
def _query_blocks(lq: int, s: int, causal: bool) -> list[tuple[int, int, int]]:
    """(first row, end row, keys seen) per query block: causal rows [a, b) see keys [0, b)."""
    n = min(QUERY_BLOCKS, lq // QUERY_BLOCK_MIN) if causal else 1
    if n < 2:
        return [(0, lq, s)]
    blk = -(-lq // n)
    return [(a, min(a + blk, lq), min(a + blk, lq, s)) for a in range(0, lq, blk)]


def _block_bias(bias, a, b, end):
    """The rows [a, b) and keys [0, end) of a (B|1, Hk|1, G|1, L|1, S|1) bias."""
    if bias is None:
        return None
    if bias.shape[3] != 1:
        bias = bias[:, :, :, a:b]
    if bias.shape[4] != 1:
        bias = bias[..., :end]
    return bias


def _core(layout, size: int):
    """The dense or the chunked core, by the size of one block's score matrix."""
    return layout.b * layout.hq * size <= DENSE_SCORES_LIMIT


def _attend(q5, k, v, bias5, causal, scale, p, key, layout):
    """out (B, Hk, G, L, E) and lse (B, Hk, G, L), query block by query block."""
    blocks = _query_blocks(layout.lq, layout.s, causal)
    outs, lses = [], []
    for i, (a, b, end) in enumerate(blocks):
        g, rows = layout.g, b - a
        dense = _core(layout, rows * end)
        run = _dense_forward if dense else _chunked_forward
        block_key = key if len(blocks) == 1 or key is None else jax.random.fold_in(key, i)
        out, lse = run(_Layout.rows(q5[:, :, :, a:b]), k[:, :, :end], v[:, :, :end],
                       _Layout.bias_rows(_block_bias(bias5, a, b, end), g), causal, scale, p,
                       block_key, a, rows)
        outs.append(out.reshape(out.shape[:2] + (g, rows) + out.shape[3:]))
        lses.append(lse.reshape(lse.shape[:2] + (g, rows)))
    return jnp.concatenate(outs, 3), jnp.concatenate(lses, 3)


def _attend_backward(grad5, q5, k, v, bias5, out5, lse5, causal, scale, p, key, want_bias,
                     layout):
    """dq (B, Hk, G, L, E), dk and dv (B, Hk, S, E), d(scores) (B, Hk, G, L, S) or None."""
    blocks = _query_blocks(layout.lq, layout.s, causal)
    dqs, dss, dkvs = [], [], []
    for i, (a, b, end) in enumerate(blocks):
        g, rows = layout.g, b - a
        dense = _core(layout, rows * end)
        run = _dense_backward if dense else _chunked_backward
        block_key = key if len(blocks) == 1 or key is None else jax.random.fold_in(key, i)
        dq, dk_i, dv_i, ds = run(
            _Layout.rows(grad5[:, :, :, a:b]), _Layout.rows(q5[:, :, :, a:b]), k[:, :, :end],
            v[:, :, :end], _Layout.bias_rows(_block_bias(bias5, a, b, end), g),
            _Layout.rows(out5[:, :, :, a:b]), _Layout.rows(lse5[:, :, :, a:b]), causal, scale,
            p, block_key, want_bias, a, rows)
        dqs.append(dq.reshape(dq.shape[:2] + (g, rows) + dq.shape[3:]))
        dkvs.append((dk_i, dv_i))
        if want_bias:
            ds = jnp.pad(ds, [(0, 0), (0, 0), (0, 0), (0, layout.s - end)])
            dss.append(ds.reshape(ds.shape[:2] + (g, rows) + ds.shape[3:]))
    # Block i's key gradients cover keys [0, end_i), the last block's the most (all of
    # them unless a causal mask hides keys past the last query).
    dk, dv = dkvs[-1]
    if dk.shape[2] < layout.s:
        pad = [(0, 0), (0, 0), (0, layout.s - dk.shape[2]), (0, 0)]
        dk, dv = jnp.pad(dk, pad), jnp.pad(dv, pad)
    for dk_i, dv_i in reversed(dkvs[:-1]):
        end = dk_i.shape[2]
        dk = lax.dynamic_update_slice(dk, dk[:, :, :end] + dk_i, (0, 0, 0, 0))
        dv = lax.dynamic_update_slice(dv, dv[:, :, :end] + dv_i, (0, 0, 0, 0))
    return (jnp.concatenate(dqs, 3), dk, dv,
            jnp.concatenate(dss, 3) if want_bias else None)


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


# -------------------------------------------------------------- a kernel from above
# A higher layer's attention kernel for the fused op (torch_pjrt.kernels' Pallas flash
# attention, where the platform compiles Pallas natively), or None.
_kernel = None


def use_kernel(kernel) -> None:
    """Let `kernel` serve the fused SDPA op where `kernel.applies(q, k, v, attn_bias,
    dropout_p)`: `kernel.forward(q, k, v, is_causal, scale)` gives (out, log-sum-exp
    [B, H, L] float32), `kernel.backward(grad, q, k, v, out, lse, is_causal, scale)`
    (dq, dk, dv). JAX functions, traced inside this op's lowering."""
    global _kernel
    _kernel = kernel


# -------------------------------------------------------------- the ops
@lower(aten._scaled_dot_product_fused_attention_overrideable.default, random=True, products=True,
       draws_if="dropout_p")
def sdpa_fused_overrideable(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False,
                            return_debug_mask=False, *, scale=None, key):
    if _kernel is not None and _kernel.applies(q, k, v, attn_bias, dropout_p):
        out, lse = _kernel.forward(q, k, v, is_causal, _scale(q, scale))
        seed, offset = _key_to_philox(key)
        return out, lse, None, None, seed, offset, None
    if cpu_kernels.attention_applies(q, k, v, attn_bias, dropout_p):
        out, lse = cpu_kernels.attention(q, k, v, is_causal, _scale(q, scale))
        seed, offset = _key_to_philox(key)
        return out, lse, None, None, seed, offset, None
    out, lse = _pure_attention(q, k, v, attn_bias, is_causal, _scale(q, scale), dropout_p,
                               key)
    seed, offset = _key_to_philox(key)
    return out, lse, None, None, seed, offset, None


def _pure_attention(q, k, v, attn_bias, is_causal, scale, dropout_p, key):
    """(out, logsumexp float32 (B, H, L)) of the pure-XLA attention, q's shape and dtype."""
    layout = _Layout(q, k)
    bias = None if attn_bias is None else layout.bias(attn_bias)
    out, lse = _attend(layout.query(q), layout.kv(k), layout.kv(v), bias, is_causal, scale,
                       dropout_p, key, layout)
    out = out.reshape(q.shape[:-1] + (v.shape[-1],)).astype(q.dtype)
    lse = lse.reshape(layout.b if q.ndim == 4 else 1, layout.hq, layout.lq)
    return out, lse.astype(jnp.float32)


# -------------------------------------------------------------- a growing key/value cache
# Decoding with a cache that grows by a token a step (Hugging Face's DynamicCache) asks for
# attention over a new key length every step: a program per length. Fused eager's kernel
# (eager/dispatch.py) pads the keys and values to a bucket of lengths
# (lowering/bucket_sizes.py) and calls this op with the true length as a run-time number:
# one program per bucket. Its outputs are the fused op's output, logsumexp, and its
# philox seed and offset (zeros: no dropout here).
_lib = torch.library.Library("pjrt", "FRAGMENT")
_lib.define("attention_prefix(Tensor query, Tensor key, Tensor value, SymInt keys, "
            "bool is_causal, float? scale=None) -> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.register_fake("pjrt::attention_prefix", lib=_lib)
def _attention_prefix_meta(q, k, v, keys, is_causal, scale=None):
    r = aten._scaled_dot_product_fused_attention_overrideable.default(
        q, k, v, None, 0.0, is_causal, False, scale=scale)
    return r[0], r[1], r[6], r[7]


@lower(torch.ops.pjrt.attention_prefix.default, products=True, dynamic=("keys",))
def attention_prefix(q, k, v, keys, is_causal, scale=None):
    """Attention of q over the first `keys` rows of k and v (the rest is padding): on
    XLA:CPU ATen's flash attention on those rows, bit for bit what it gives unpadded;
    elsewhere the core with the padding (and, causal, the rows' future keys: top-left
    aligned, as PyTorch's is_causal) masked out."""
    zero = jnp.zeros((), jnp.int64)
    scale = _scale(q, scale)
    if cpu_kernels.attention_applies(q, k, v, None, 0.0):
        out, lse = cpu_kernels.attention(q, k, v, is_causal, scale, keys=keys)
        return out, lse, zero, zero
    key_pos = jnp.arange(k.shape[-2])
    seen = key_pos[None, :] < keys
    if is_causal:
        seen = seen & (key_pos[None, :] <= jnp.arange(q.shape[-2])[:, None])
    bias = jnp.where(seen, 0.0, -jnp.inf).astype(q.dtype)
    out, lse = _pure_attention(q, k, v, bias, False, scale, 0.0, None)
    return out, lse, zero, zero


def _key_to_philox(key):
    """The op's PRNG key as two int64 scalars (PyTorch's philox_seed / philox_offset slots)."""
    data = jax.random.key_data(key).reshape(-1).astype(jnp.int64)
    return data[0], data[1]


def _philox_to_key(seed, offset):
    data = jnp.stack([seed.reshape(()), offset.reshape(())]).astype(jnp.uint32)
    return jax.random.wrap_key_data(data)


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default, products=True)
def sdpa_fused_overrideable_backward(grad, q, k, v, attn_bias, grad_input_mask, out, logsumexp,
                                     cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                     philox_seed, philox_offset, *, scale=None):
    if _kernel is not None and _kernel.applies(q, k, v, attn_bias, dropout_p):
        grads = _kernel.backward(grad, q, k, v, out, logsumexp, is_causal, _scale(q, scale))
        return tuple(g if m else None for g, m in zip((*grads, None), grad_input_mask))
    if cpu_kernels.attention_applies(q, k, v, attn_bias, dropout_p):
        grads = cpu_kernels.attention_backward(grad, q, k, v, out, logsumexp, is_causal,
                                               _scale(q, scale))
        return tuple(g if m else None for g, m in zip(grads + (None,), grad_input_mask))
    layout = _Layout(q, k)
    bias = None if attn_bias is None else layout.bias(attn_bias)
    want_bias = attn_bias is not None and grad_input_mask[3] \
        and jnp.issubdtype(attn_bias.dtype, jnp.floating)
    key = _philox_to_key(philox_seed, philox_offset) if dropout_p > 0 else None
    lse = logsumexp.reshape(layout.b, layout.hk, layout.g, layout.lq)
    dq, dk, dv, ds = _attend_backward(layout.query(grad), layout.query(q), layout.kv(k),
                                      layout.kv(v), bias, layout.query(out), lse, is_causal,
                                      _scale(q, scale), dropout_p, key, want_bias, layout)
    grads = [dq.reshape(q.shape).astype(q.dtype), dk.reshape(k.shape).astype(k.dtype),
             dv.reshape(v.shape).astype(v.dtype),
             layout.bias_back(ds, attn_bias.shape).astype(attn_bias.dtype) if want_bias else None]
    return tuple(g if m else None for g, m in zip(grads, grad_input_mask))


@lower(aten._safe_softmax.default)
def safe_softmax(x, dim, dtype=None):
    """softmax(x), with zeros for the rows where every element is -inf (fully masked)."""
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    if x.ndim == 0:
        return jnp.ones_like(xf)
    m = jnp.max(xf, axis=dim, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(xf - m)
    total = jnp.sum(e, axis=dim, keepdims=True)
    masked = jnp.all(xf == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, 0, e / total)
