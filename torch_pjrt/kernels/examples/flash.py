"""Blocked flash attention as Pallas kernels, forward and backward (causal or not): one
query block per program, keys and values read block by block with an online softmax; the
backward recomputes each block's probabilities from the saved log-sum-exp (one kernel for
the queries' gradient, one for the keys' and values'), so no score matrix is ever held.

`F.scaled_dot_product_attention` on pjrt selects it through the fused SDPA op's kernel hook
(lowering/families/attention.py) where the platform compiles Pallas natively; on XLA:CPU
SDPA keeps its own lowering and this op runs in Pallas's interpreter when called."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from ...lowering.families import attention
from .. import pallas
from ..register import register_jax
from ._blocks import NAMESPACE, block, pad_to, pl

QUERIES = 128  # query rows per program
KEYS = 128  # keys per step
MAX_HEAD_DIM = 256
_NEG = -1e30  # a masked score (finite: a fully masked block gives no NaN)
_DOT = functools.partial(jax.lax.dot_general, preferred_element_type=jnp.float32)


def _mm(a, b):  # a @ b
    return _DOT(a, b, (((1,), (0,)), ((), ())))


def _mm_t(a, b):  # a @ b.T
    return _DOT(a, b, (((1,), (1,)), ((), ())))


def _t_mm(a, b):  # a.T @ b
    return _DOT(a, b, (((0,), (0,)), ((), ())))


def _mask(s, q_start, k_start, causal, len_q, len_k):
    rows = q_start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = k_start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    keep = (cols < len_k) & (rows < len_q)
    if causal:  # PyTorch's is_causal: top-left aligned
        keep &= cols <= rows
    return keep


def _key_blocks_for(q_block, bq, bk, n_k, causal):
    """How many key blocks query block `q_block` meets."""
    if not causal:
        return n_k
    return jnp.minimum(n_k, ((q_block + 1) * bq + bk - 1) // bk)


# ------------------------------------------------------------------ the Pallas kernels
def _forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, causal, scale, bk, len_q, len_k):
    bq = q_ref.shape[0]
    i = pl.program_id(1)
    q = q_ref[...].astype(jnp.float32) * scale

    def step(j, carry):
        m, total, acc = carry
        k = k_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        v = v_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        s = _mm_t(q, k)
        s = jnp.where(_mask(s, i * bq, j * bk, causal, len_q, len_k), s, _NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        alpha = jnp.exp(m - m_new)
        return m_new, total * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + _mm(p, v)

    n = _key_blocks_for(i, bq, bk, k_ref.shape[0] // bk, causal)
    start = (jnp.full((bq,), _NEG, jnp.float32), jnp.zeros((bq,), jnp.float32),
             jnp.zeros((bq, v_ref.shape[1]), jnp.float32))
    m, total, acc = jax.lax.fori_loop(0, n, step, start)
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(total)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, causal, scale, bk,
               len_q, len_k):
    bq = q_ref.shape[0]
    i = pl.program_id(1)
    q = q_ref[...].astype(jnp.float32) * scale
    do = do_ref[...].astype(jnp.float32)
    lse, delta = lse_ref[...], delta_ref[...]

    def step(j, dq):
        k = k_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        v = v_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        s = _mm_t(q, k)
        keep = _mask(s, i * bq, j * bk, causal, len_q, len_k)
        p = jnp.where(keep, jnp.exp(s - lse[:, None]), 0.0)
        ds = p * (_mm_t(do, v) - delta[:, None])
        return dq + _mm(ds, k)

    n = _key_blocks_for(i, bq, bk, k_ref.shape[0] // bk, causal)
    dq = jax.lax.fori_loop(0, n, step, jnp.zeros(q_ref.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, causal,
                scale, bq, len_q, len_k):
    bk = k_ref.shape[0]
    j = pl.program_id(1)
    k = k_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)

    def step(i, carry):
        dk, dv = carry
        q = q_ref[pl.ds(i * bq, bq), :].astype(jnp.float32) * scale
        do = do_ref[pl.ds(i * bq, bq), :].astype(jnp.float32)
        lse = lse_ref[pl.ds(i * bq, bq)]
        delta = delta_ref[pl.ds(i * bq, bq)]
        s = _mm_t(q, k)
        keep = _mask(s, i * bq, j * bk, causal, len_q, len_k)
        p = jnp.where(keep, jnp.exp(s - lse[:, None]), 0.0)
        ds = p * (_mm_t(do, v) - delta[:, None])
        return dk + _t_mm(ds, q), dv + _t_mm(p, do)

    first = (j * bk) // bq if causal else 0  # query blocks before it see none of these keys
    dk, dv = jax.lax.fori_loop(first, q_ref.shape[0] // bq, step,
                               (jnp.zeros(k.shape, jnp.float32),
                                jnp.zeros(v.shape, jnp.float32)))
    dk_ref[...] = dk.astype(dk_ref.dtype)  # the scale is in q already
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ------------------------------------------------------------------ JAX functions
def _flat(x, blk):
    """[B, H, L, E] as [B*H, L padded to blk, E]."""
    return pad_to(x.reshape((-1,) + x.shape[-2:]), 1, blk)


def _sizes(q, k):
    return block(q.shape[-2], QUERIES), block(k.shape[-2], KEYS)


def _row_spec(blk, width):
    return pl.BlockSpec((None, blk, width), lambda b, i: (b, i, 0))


def _whole_spec(x):
    return pl.BlockSpec((None,) + x.shape[1:], lambda b, i: (b,) + (0,) * (x.ndim - 1))


def _vec_spec(blk):
    return pl.BlockSpec((None, blk), lambda b, i: (b, i))


def forward(q, k, v, causal: bool, scale: float):
    """The JAX function: (out [B, H, L, Ev] in q's dtype, log-sum-exp [B, H, L] float32)."""
    bq, bk = _sizes(q, k)
    len_q, len_k = q.shape[-2], k.shape[-2]
    qf, kf, vf = _flat(q, bq), _flat(k, bk), _flat(v, bk)
    out, lse = pl.pallas_call(
        functools.partial(_forward_kernel, causal=causal, scale=scale, bk=bk, len_q=len_q,
                          len_k=len_k),
        out_shape=(jax.ShapeDtypeStruct(qf.shape[:2] + vf.shape[2:], q.dtype),
                   jax.ShapeDtypeStruct(qf.shape[:2], jnp.float32)),
        grid=(qf.shape[0], qf.shape[1] // bq),
        in_specs=[_row_spec(bq, qf.shape[2]), _whole_spec(kf), _whole_spec(vf)],
        out_specs=(_row_spec(bq, vf.shape[2]), _vec_spec(bq)),
    )(qf, kf, vf)
    return (out[:, :len_q].reshape(q.shape[:-1] + v.shape[-1:]),
            lse[:, :len_q].reshape(q.shape[:-1]))


def backward(grad, q, k, v, out, lse, causal: bool, scale: float):
    """The JAX function: (dq, dk, dv) from the output's gradient and the forward's results."""
    bq, bk = _sizes(q, k)
    len_q, len_k = q.shape[-2], k.shape[-2]
    qf, kf, vf = _flat(q, bq), _flat(k, bk), _flat(v, bk)
    dof = _flat(grad, bq)
    delta = jnp.sum(grad.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    lsef = pad_to(lse.reshape(-1, len_q).astype(jnp.float32), 1, bq)
    deltaf = pad_to(delta.reshape(-1, len_q), 1, bq)
    params = dict(causal=causal, scale=scale, len_q=len_q, len_k=len_k)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, bk=bk, **params),
        out_shape=jax.ShapeDtypeStruct(qf.shape, q.dtype),
        grid=(qf.shape[0], qf.shape[1] // bq),
        in_specs=[_row_spec(bq, qf.shape[2]), _whole_spec(kf), _whole_spec(vf),
                  _row_spec(bq, dof.shape[2]), _vec_spec(bq), _vec_spec(bq)],
        out_specs=_row_spec(bq, qf.shape[2]),
    )(qf, kf, vf, dof, lsef, deltaf)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, bq=bq, **params),
        out_shape=(jax.ShapeDtypeStruct(kf.shape, k.dtype),
                   jax.ShapeDtypeStruct(vf.shape, v.dtype)),
        grid=(kf.shape[0], kf.shape[1] // bk),
        in_specs=[_whole_spec(qf), _row_spec(bk, kf.shape[2]), _row_spec(bk, vf.shape[2]),
                  _whole_spec(dof), _whole_spec(lsef), _whole_spec(deltaf)],
        out_specs=(_row_spec(bk, kf.shape[2]), _row_spec(bk, vf.shape[2])),
    )(qf, kf, vf, dof, lsef, deltaf)
    return (dq[:, :len_q].reshape(q.shape), dk[:, :len_k].reshape(k.shape),
            dv[:, :len_k].reshape(v.shape))


# ------------------------------------------------------------------ the operators
def _reference(q, k, v, causal, scale):
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device)
                          .tril().logical_not(), float("-inf"))
    return s


@torch.library.custom_op(f"{NAMESPACE}::flash_attention", mutates_args=())
def _flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = _reference(q, k, v, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype), lse


@_flash_attention.register_fake
def _(q, k, v, causal, scale):
    return (q.new_empty(q.shape[:-1] + v.shape[-1:]),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.custom_op(f"{NAMESPACE}::flash_attention_backward", mutates_args=())
def _flash_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                              causal: bool, scale: float
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = torch.exp(_reference(q, k, v, causal, scale) - lse[..., None])
    g = grad.float()
    dv = p.transpose(-2, -1) @ g
    dp = g @ v.float().transpose(-2, -1)
    ds = p * (dp - (g * out.float()).sum(-1, keepdim=True))
    dq = ds @ k.float() * scale
    dk = ds.transpose(-2, -1) @ q.float() * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_flash_attention_backward.register_fake
def _(grad, q, k, v, out, lse, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.mark_non_differentiable(output[1])
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*_flash_attention_backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale),
            None, None)


_flash_attention.register_autograd(_backward, setup_context=_setup)
register_jax(_flash_attention, forward)
register_jax(_flash_attention_backward, backward)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Attention of q [..., L, E] over k [..., S, E] and v [..., S, Ev] (as
    F.scaled_dot_product_attention without mask or dropout; `scale` defaults to
    1/sqrt(E)): the Pallas kernels on pjrt, PyTorch's math on CPU."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _flash_attention(q, k, v, causal, scale)[0]


# ------------------------------------------------------------------ SDPA's selection
def selected() -> bool:
    """Whether the fused SDPA op takes these kernels: where the platform compiles Pallas
    natively (tests force it on XLA:CPU, where they run interpreted)."""
    return pallas.native()


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class SDPAKernel:
    """What lowering/families/attention.py's kernel hook calls (JAX functions, inside the
    SDPA op's own lowering)."""

    @staticmethod
    def applies(q, k, v, attn_bias, dropout_p) -> bool:
        """4-D, no mask, no dropout, as many key as query heads, one floating dtype; whole
        blocks and power-of-two head dimensions (what every Pallas backend compiles)."""
        return (selected() and attn_bias is None and not dropout_p and q.ndim == 4
                and k.ndim == 4 and v.ndim == 4
                and k.shape[:2] == q.shape[:2] and v.shape[:3] == k.shape[:3]
                and q.shape[-1] == k.shape[-1]
                and all(_power_of_two(d) and d <= MAX_HEAD_DIM
                        for d in (q.shape[-1], v.shape[-1]))
                and q.shape[2] % QUERIES == 0 and k.shape[2] % KEYS == 0
                and q.dtype == k.dtype == v.dtype
                and jnp.issubdtype(q.dtype, jnp.floating))

    @staticmethod
    def forward(q, k, v, causal, scale):
        return pallas.interpreting(forward)(q, k, v, causal, scale)

    @staticmethod
    def backward(grad, q, k, v, out, lse, causal, scale):
        return pallas.interpreting(backward)(grad, q, k, v, out, lse, causal, scale)


attention.use_kernel(SDPAKernel)
