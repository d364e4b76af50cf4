"""nn.LSTM on pjrt as one operator: the whole sequence of every layer as a lax.scan.

PyTorch's `aten::lstm.input` is a composite: on any device but the CPU it runs as one
`_thnn_fused_lstm_cell` per time step and layer, each with its own autograd node. In fused
eager that is a graph of thousands of ops for a 64-step, 2-layer model, which XLA:CPU took
111 s to compile (bench/models.py's LSTM, December 3; 3 s as one operator). Here
`aten::lstm.input` has a pjrt autograd kernel that calls `pjrt_rnn::lstm`, a JAX function
scanning over time (one loop body per layer and direction, whatever the length), with a
backward scan of its own (`_lstm_direction_bwd`). Calls it does not cover (dropout between
layers while training, projections, mixed dtypes) run PyTorch's composite as before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .jax_op import jax_op
from .library import library

_SCHEMA = ("(Tensor x, Tensor h0, Tensor c0, Tensor[] params, bool has_biases, "
           "int num_layers, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)")


def _acc(dtype):
    """Low-precision gates compute in float32, as PyTorch's fused cell does."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _forward(x, h0, c0, w_ih, w_hh, bias):
    """One layer, one direction, in time order: x [T, B, I] -> outputs [T, B, H], and
    what the backward reads (the cell states and activated gates of every step)."""
    acc = _acc(x.dtype)
    xw = jnp.einsum("tbi,gi->tbg", x, w_ih, preferred_element_type=acc) + bias.astype(acc)

    def step(carry, xw_t):
        h, c = carry
        gates = xw_t + jnp.dot(h, w_hh.T, preferred_element_type=acc)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c = f * c + i * g
        h = (o * jnp.tanh(c)).astype(x.dtype)
        return (h, c), (h, c, jnp.concatenate([i, f, g, o], axis=-1))

    # (unrolling the scan by 2-16 steps was no faster on XLA:CPU and compiled slower)
    _, (hs, cs, gates) = lax.scan(step, (h0, c0.astype(acc)), xw)
    return hs, cs, gates


@jax.custom_vjp
def _lstm_direction(x, h0, c0, w_ih, w_hh, bias):
    hs, cs, _ = _forward(x, h0, c0, w_ih, w_hh, bias)
    return hs, hs[-1], cs[-1].astype(x.dtype)


def _lstm_direction_fwd(x, h0, c0, w_ih, w_hh, bias):
    hs, cs, gates = _forward(x, h0, c0, w_ih, w_hh, bias)
    return (hs, hs[-1], cs[-1].astype(x.dtype)), (x, h0, c0, w_ih, w_hh, bias, hs, cs, gates)


def _lstm_direction_bwd(res, grads):
    """The backward scan carries only dh and dc (one [B, 4H] x [4H, H] product per step);
    the weight, bias and input gradients are three products over all steps after it
    (jax.vjp of the scan accumulated them step by step)."""
    x, h0, c0, w_ih, w_hh, bias, hs, cs, gates = res
    d_out, d_hn, d_cn = grads
    acc = _acc(x.dtype)
    c_prev = jnp.concatenate([c0.astype(acc)[None], cs[:-1]])

    def step(carry, t):
        dh, dc = carry
        d_out_t, c_t, c_prev_t, gates_t = t
        i, f, g, o = jnp.split(gates_t, 4, axis=-1)
        dh = dh + d_out_t.astype(acc)
        tanh_c = jnp.tanh(c_t)
        dc = dc + dh * o * (1 - tanh_c * tanh_c)
        d_gates = jnp.concatenate([dc * g * i * (1 - i), dc * c_prev_t * f * (1 - f),
                                   dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], axis=-1)
        dh = jnp.dot(d_gates, w_hh.astype(acc), preferred_element_type=acc)
        return (dh, dc * f), d_gates

    (dh0, dc0), d_gates = lax.scan(step, (d_hn.astype(acc), d_cn.astype(acc)),
                                   (d_out, cs, c_prev, gates), reverse=True)
    h_prev = jnp.concatenate([h0[None], hs[:-1]]).astype(acc)
    d_w_hh = jnp.einsum("tbg,tbh->gh", d_gates, h_prev)
    d_w_ih = jnp.einsum("tbg,tbi->gi", d_gates, x.astype(acc))
    d_x = jnp.einsum("tbg,gi->tbi", d_gates, w_ih.astype(acc))
    return (d_x.astype(x.dtype), dh0.astype(h0.dtype), dc0.astype(c0.dtype),
            d_w_ih.astype(w_ih.dtype), d_w_hh.astype(w_hh.dtype),
            d_gates.sum((0, 1)).astype(bias.dtype))


_lstm_direction.defvjp(_lstm_direction_fwd, _lstm_direction_bwd)


def _direction(x, h, c, w_ih, w_hh, bias, reverse: bool):
    """One layer, one direction: x [T, B, I] -> outputs [T, B, H], last h and c."""
    if bias is None:
        bias = jnp.zeros((w_ih.shape[0],), x.dtype)
    if reverse:
        out, h, c = _lstm_direction(x[::-1], h, c, w_ih, w_hh, bias)
        return out[::-1], h, c
    return _lstm_direction(x, h, c, w_ih, w_hh, bias)


@jax_op("pjrt_rnn::lstm", _SCHEMA)
def lstm(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first):
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w = params[k * per:(k + 1) * per]
            bias = w[2] + w[3] if has_biases else None
            out, h, c = _direction(x, h0[k], c0[k], w[0], w[1], bias, reverse=d == 1)
            outs.append(out)
            hs.append(h)
            cs.append(c)
        x = outs[0] if dirs == 1 else jnp.concatenate(outs, axis=-1)
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    return x, jnp.stack(hs), jnp.stack(cs)


def _covered(inp, hx, params, has_biases, num_layers, dropout, train, bidirectional) -> bool:
    dirs = 2 if bidirectional else 1
    return (inp.dim() == 3 and len(hx) == 2 and hx[0].dim() == 3
            and hx[0].shape[-1] == hx[1].shape[-1]  # no projection (proj_size)
            and len(params) == num_layers * dirs * (4 if has_biases else 2)
            and not (train and dropout > 0 and num_layers > 1)
            and all(t.dtype == inp.dtype for t in (*hx, *params)))


def _lstm_input(inp, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                batch_first):
    if not _covered(inp, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        return torch.ops.aten.lstm.input.decompose(
            inp, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first)
    return lstm(inp, hx[0], hx[1], list(params), has_biases, num_layers, bidirectional,
                batch_first)


library("aten", "IMPL").impl("lstm.input", _lstm_input, "AutogradPrivateUse1")
