"""nn.LSTM on pjrt as one operator: the whole sequence of every layer as a lax.scan.

PyTorch's `aten::lstm.input` is a composite: on any device but the CPU it runs as one
`_thnn_fused_lstm_cell` per time step and layer, each with its own autograd node. In fused
eager that is a graph of thousands of ops for a 64-step, 2-layer model, which XLA:CPU took
about 10 minutes to compile (bench/models.py's LSTM, December 3). Here `aten::lstm.input`
has a pjrt autograd kernel that calls `pjrt_rnn::lstm`, a JAX function scanning over time
(one loop body per layer and direction, whatever the length), with its backward from
jax.vjp. Calls it does not cover (dropout between layers while training, projections,
unbatched input) run PyTorch's composite as before.
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


def _direction(x, h, c, w_ih, w_hh, bias, reverse: bool):
    """One layer, one direction: x [T, B, I] -> outputs [T, B, H], last h and c."""
    dtype = x.dtype
    # low-precision gates compute in float32, as PyTorch's fused cell does
    acc = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
    xw = jnp.einsum("tbi,gi->tbg", x, w_ih, preferred_element_type=acc)
    if bias is not None:
        xw = xw + bias.astype(acc)

    def step(carry, xw_t):
        h, c = carry
        gates = xw_t + jnp.dot(h, w_hh.T, preferred_element_type=acc)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c.astype(acc) + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(dtype)
        c = c.astype(dtype)
        return (h, c), h

    # (unrolling the scan by 2-16 steps was no faster on XLA:CPU and compiled slower)
    (h, c), out = lax.scan(step, (h, c), xw, reverse=reverse)
    return out, h, c


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
