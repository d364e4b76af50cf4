"""Softmax cross-entropy over a large vocabulary as Pallas kernels: the forward reads each
row block's logits in vocabulary blocks, keeping a running maximum, sum and the target's
logit (an online log-sum-exp), so no [rows, vocabulary] probabilities exist; the backward
writes the logits' gradient block by block from the saved log-sum-exp."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from ..register import register_jax
from ._blocks import NAMESPACE, block, pad_to, pl

ROWS = 8  # rows per program
VOCAB = 512  # logits read per step (forward) or written per program (backward)


# ------------------------------------------------------------------ the Pallas kernels
def _forward_kernel(x_ref, t_ref, loss_ref, lse_ref, *, vocab, chunk, ignore_index):
    rows = x_ref.shape[0]
    target = t_ref[...]

    def step(j, carry):
        m, s, picked = carry
        x = x_ref[:, pl.ds(j * chunk, chunk)].astype(jnp.float32)
        col = j * chunk + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        x = jnp.where(col < vocab, x, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(x, axis=1))
        s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new[:, None]), axis=1)
        picked = picked + jnp.sum(jnp.where(col == target[:, None], x, 0.0), axis=1)
        return m_new, s, picked

    start = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    m, s, picked = jax.lax.fori_loop(0, x_ref.shape[1] // chunk, step, start)
    lse = m + jnp.log(s)
    lse_ref[...] = lse
    loss_ref[...] = jnp.where(target == ignore_index, 0.0, lse - picked)


def _backward_kernel(g_ref, x_ref, t_ref, lse_ref, dx_ref, *, chunk, ignore_index):
    x = x_ref[...].astype(jnp.float32)
    target = t_ref[...]
    col = pl.program_id(1) * chunk + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    p = jnp.exp(x - lse_ref[...][:, None])
    g = jnp.where(target == ignore_index, 0.0, g_ref[...].astype(jnp.float32))
    dx = (p - (col == target[:, None]).astype(jnp.float32)) * g[:, None]
    dx_ref[...] = dx.astype(dx_ref.dtype)


def _blocked(logits, target):
    """Logits [N, V] padded to whole blocks, targets as int32 likewise; block sizes."""
    rows, chunk = block(logits.shape[0], ROWS), block(logits.shape[1], VOCAB)
    x = pad_to(pad_to(logits, 0, rows), 1, chunk)
    t = pad_to(target.astype(jnp.int32), 0, rows)
    return x, t, rows, chunk


def forward(logits, target, ignore_index: int = -100):
    """The JAX function: (per-row loss, per-row log-sum-exp), float32 [N] each."""
    n, vocab = logits.shape
    x, t, rows, chunk = _blocked(logits, target)
    loss, lse = pl.pallas_call(
        functools.partial(_forward_kernel, vocab=vocab, chunk=chunk,
                          ignore_index=ignore_index),
        out_shape=(jax.ShapeDtypeStruct((x.shape[0],), jnp.float32),) * 2,
        grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                  pl.BlockSpec((rows,), lambda i: (i,))],
        out_specs=(pl.BlockSpec((rows,), lambda i: (i,)),) * 2,
    )(x, t)
    return loss[:n], lse[:n]


def backward(grad, logits, target, lse, ignore_index: int = -100):
    """The JAX function: the logits' gradient for the loss's gradient `grad`."""
    n, vocab = logits.shape
    x, t, rows, chunk = _blocked(logits, target)
    g, lse = pad_to(grad, 0, rows), pad_to(lse, 0, rows)
    dx = pl.pallas_call(
        functools.partial(_backward_kernel, chunk=chunk, ignore_index=ignore_index),
        out_shape=jax.ShapeDtypeStruct(x.shape, logits.dtype),
        grid=(x.shape[0] // rows, x.shape[1] // chunk),
        in_specs=[pl.BlockSpec((rows,), lambda i, j: (i,)),
                  pl.BlockSpec((rows, chunk), lambda i, j: (i, j)),
                  pl.BlockSpec((rows,), lambda i, j: (i,)),
                  pl.BlockSpec((rows,), lambda i, j: (i,))],
        out_specs=pl.BlockSpec((rows, chunk), lambda i, j: (i, j)),
    )(g, x, t, lse)
    return dx[:n, :vocab]


# ------------------------------------------------------------------ the operators
@torch.library.custom_op(f"{NAMESPACE}::softmax_cross_entropy", mutates_args=())
def _softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                           ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(logits.float(), dim=1)
    loss = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none",
                                             ignore_index=ignore_index)
    return loss, lse


@_softmax_cross_entropy.register_fake
def _(logits, target, ignore_index):
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=torch.float32), logits.new_empty((n,),
                                                                         dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::softmax_cross_entropy_backward", mutates_args=())
def _softmax_cross_entropy_backward(grad: torch.Tensor, logits: torch.Tensor,
                                    target: torch.Tensor, lse: torch.Tensor,
                                    ignore_index: int) -> torch.Tensor:
    p = torch.exp(logits.float() - lse[:, None])
    keep = target != ignore_index
    onehot = torch.zeros_like(p)
    onehot[keep, target[keep]] = 1.0
    return ((p - onehot) * (grad * keep)[:, None]).to(logits.dtype)


@_softmax_cross_entropy_backward.register_fake
def _(grad, logits, target, lse, ignore_index):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output):
    logits, target, ignore_index = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.mark_non_differentiable(output[1])  # the log-sum-exp is saved, not differentiated
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_loss, grad_lse):
    logits, target, lse = ctx.saved_tensors
    return _softmax_cross_entropy_backward(grad_loss, logits, target, lse,
                                           ctx.ignore_index), None, None


_softmax_cross_entropy.register_autograd(_backward, setup_context=_setup)
register_jax(_softmax_cross_entropy, forward)
register_jax(_softmax_cross_entropy_backward, backward)


def softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                          ignore_index: int = -100) -> torch.Tensor:
    """Per-row cross-entropy of `logits` [N, V] against class indices `target` [N]
    (F.cross_entropy(..., reduction="none"); rows whose target is `ignore_index` give 0),
    float32. Gradients flow to `logits`; the log-sum-exp of the softmax is not returned."""
    return _softmax_cross_entropy(logits, target, ignore_index)[0]
