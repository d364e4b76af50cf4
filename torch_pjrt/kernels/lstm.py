"""nn.LSTM on pjrt as one operator: the whole sequence of every layer as a lax.scan.

PyTorch's `aten::lstm.input` is a composite: on any device but the CPU it runs as one
`_thnn_fused_lstm_cell` per time step and layer, each with its own autograd node. In fused
eager that is a graph of thousands of ops for a 64-step, 2-layer model, which XLA:CPU took
111 s to compile (bench/models.py's LSTM, December 3; 3 s as one operator). Here
`aten::lstm.input` has a pjrt autograd kernel. Without gradients it calls `pjrt_rnn::lstm`,
one scan over time per layer and direction. With them, `pjrt_rnn::lstm_train` runs the same
scans and also returns what the backward reads (every step's cell state and activated
gates), and `pjrt_rnn::lstm_backward` runs the backward scans from those: the forward is
not computed twice, as a vjp of the inference op would (that recomputation was a third of
the zoo LSTM's device time). Calls it does not cover (dropout between layers while
training, projections, mixed dtypes) run PyTorch's composite as before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .jax_op import jax_op
from .library import library

_FLAGS = "bool has_biases, int num_layers, bool bidirectional, bool batch_first"


def _acc(dtype):
    """Low-precision gates compute in float32, as PyTorch's fused cell does."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _forward(x, h0, c0, w_ih, w_hh, bias):
    """One layer, one direction, in time order: x [T, B, I] -> outputs [T, B, H], and
    what the backward reads (the cell states and activated gates [i f g o] of every step).

    The activations run over the whole [B, 4H] gate row, sigmoid and tanh both, and a
    select keeps tanh for the g lanes: on XLA:CPU that is 1.4x faster than activating the
    four slices apart (64 steps, B 16, H 256: 7.4 against 10.4 ms), whose slices keep
    the loop body's fusions from vectorising."""
    acc = _acc(x.dtype)
    hidden = w_hh.shape[1]
    xw = jnp.einsum("tbi,gi->tbg", x, w_ih, preferred_element_type=acc) + bias.astype(acc)
    is_g = (jnp.arange(4 * hidden) // hidden) == 2

    def step(carry, xw_t):
        h, c = carry
        gates = xw_t + jnp.dot(h, w_hh.T, preferred_element_type=acc)
        act = jnp.where(is_g, jnp.tanh(gates), jax.nn.sigmoid(gates))
        i, f, g, o = (act[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = f * c + i * g
        h = (o * jnp.tanh(c)).astype(x.dtype)
        return (h, c), (h, c, act)

    # (unrolling the scan by 2-16 steps was no faster on XLA:CPU and compiled slower)
    _, (hs, cs, gates) = lax.scan(step, (h0, c0.astype(acc)), xw)
    return hs, cs, gates


def _backward(x, h0, c0, w_ih, w_hh, hs, cs, gates, d_out, d_hn, d_cn):
    """The gradients of one layer and direction from its forward's saved steps (d_x and
    the bias's in the gates' dtype, the rest in their arguments'). The
    backward scan carries only dh and dc (one [B, 4H] x [4H, H] product per step); the
    weight, bias and input gradients are three products over all steps after it (jax.vjp
    of the scan accumulated them step by step: 94 against 72 ms)."""
    acc = _acc(x.dtype)
    hidden = w_hh.shape[1]
    c_prev = jnp.concatenate([c0.astype(acc)[None], cs[:-1]])
    w = w_hh.astype(acc)

    def step(carry, t):
        dh, dc = carry
        d_out_t, c_t, c_prev_t, gates_t = t
        i, f, g, o = (gates_t[:, k * hidden:(k + 1) * hidden] for k in range(4))
        dh = dh + d_out_t.astype(acc)
        tanh_c = jnp.tanh(c_t)
        dc = dc + dh * o * (1 - tanh_c * tanh_c)
        d_gates = jnp.concatenate([dc * g * i * (1 - i), dc * c_prev_t * f * (1 - f),
                                   dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], axis=-1)
        dh = jnp.dot(d_gates, w, preferred_element_type=acc)
        return (dh, dc * f), d_gates

    (dh0, dc0), d_gates = lax.scan(step, (d_hn.astype(acc), d_cn.astype(acc)),
                                   (d_out, cs, c_prev, gates), reverse=True)
    h_prev = jnp.concatenate([h0[None], hs[:-1]]).astype(acc)
    d_w_hh = jnp.einsum("tbg,tbh->gh", d_gates, h_prev)
    d_w_ih = jnp.einsum("tbg,tbi->gi", d_gates, x.astype(acc))
    d_x = jnp.einsum("tbg,gi->tbi", d_gates, w_ih.astype(acc))
    return (d_x, dh0.astype(h0.dtype), dc0.astype(c0.dtype), d_w_ih.astype(w_ih.dtype),
            d_w_hh.astype(w_hh.dtype), d_gates.sum((0, 1)))


def _flip(reverse: bool, *xs):
    """The reverse direction scans the time-reversed sequence."""
    return [a[::-1] for a in xs] if reverse else list(xs)


def _layers(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first, keep):
    """Every layer and direction forward; returns (output, h_n, c_n, saved): saved holds,
    per layer and direction when `keep`, its outputs, cell states and gates in scan
    (time-reversed for the reverse direction) order."""
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hs, cs, saved = [], [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w = params[k * per:(k + 1) * per]
            bias = w[2] + w[3] if has_biases else jnp.zeros((w[0].shape[0],), x.dtype)
            (seq,) = _flip(d == 1, x)
            out, cell, gates = _forward(seq, h0[k], c0[k], w[0], w[1], bias)
            if keep:
                saved += [out, cell, gates]
            hs.append(out[-1])
            cs.append(cell[-1].astype(x.dtype))
            outs += _flip(d == 1, out)
        x = outs[0] if dirs == 1 else jnp.concatenate(outs, axis=-1)
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    return x, jnp.stack(hs), jnp.stack(cs), saved


_ARGS = "Tensor x, Tensor h0, Tensor c0, Tensor[] params, " + _FLAGS


@jax_op("pjrt_rnn::lstm", f"({_ARGS}) -> (Tensor, Tensor, Tensor)", differentiable=False)
def lstm(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first):
    return _layers(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first,
                   keep=False)[:3]


@jax_op("pjrt_rnn::lstm_train", f"({_ARGS}) -> Tensor[]", differentiable=False)
def lstm_train(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first):
    """[output, h_n, c_n, then per layer and direction: outputs, cell states, gates]."""
    out, hn, cn, saved = _layers(x, h0, c0, params, has_biases, num_layers, bidirectional,
                                 batch_first, keep=True)
    return [out, hn, cn, *saved]


@jax_op("pjrt_rnn::lstm_backward",
        f"(Tensor d_out, Tensor d_hn, Tensor d_cn, Tensor[] saved, {_ARGS}) -> Tensor[]",
        differentiable=False)
def lstm_backward(d_out, d_hn, d_cn, saved, x, h0, c0, params, has_biases, num_layers,
                  bidirectional, batch_first):
    """[d_x, d_h0, d_c0, then the gradient of each of params]."""
    if batch_first:
        x, d_out = jnp.swapaxes(x, 0, 1), jnp.swapaxes(d_out, 0, 1)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    d_h0, d_c0 = [None] * (num_layers * dirs), [None] * (num_layers * dirs)
    d_params = [None] * len(params)
    for layer in reversed(range(num_layers)):
        inp = x if layer == 0 else jnp.concatenate(
            [_flip(d == 1, saved[3 * ((layer - 1) * dirs + d)])[0] for d in range(dirs)], -1)
        d_inp = 0  # in the gates' dtype: a bidirectional layer adds two
        hidden = h0.shape[-1]
        for d in range(dirs):
            k = layer * dirs + d
            w = params[k * per:(k + 1) * per]
            out, cell, gates = saved[3 * k:3 * k + 3]
            (seq, d_seq) = _flip(d == 1, inp, d_out[..., d * hidden:(d + 1) * hidden])
            grads = _backward(seq, h0[k], c0[k], w[0], w[1], out, cell, gates, d_seq,
                              d_hn[k], d_cn[k])
            d_inp = d_inp + _flip(d == 1, grads[0])[0]
            d_h0[k], d_c0[k] = grads[1], grads[2]
            d_params[k * per], d_params[k * per + 1] = grads[3], grads[4]
            if has_biases:
                d_params[k * per + 2] = d_params[k * per + 3] = grads[5].astype(w[2].dtype)
        d_out = d_inp.astype(x.dtype)
    d_x = jnp.swapaxes(d_out, 0, 1) if batch_first else d_out
    return [d_x, jnp.stack(d_h0), jnp.stack(d_c0), *d_params]


class _Scanned(torch.autograd.Function):
    """Autograd for the scanned LSTM: lstm_train forward, lstm_backward backward."""

    @staticmethod
    def forward(ctx, x, h0, c0, flags, *params):
        results = lstm_train(x, h0, c0, list(params), *flags)
        saved = results[3:]
        ctx.flags, ctx.n_saved = flags, len(saved)
        ctx.save_for_backward(x, h0, c0, *saved, *params)
        return results[0], results[1], results[2]

    @staticmethod
    def backward(ctx, d_out, d_hn, d_cn):
        x, h0, c0, *rest = ctx.saved_tensors
        saved, params = rest[:ctx.n_saved], rest[ctx.n_saved:]
        if torch.is_grad_enabled():  # create_graph: the gradients must be differentiable
            return _differentiable_backward(ctx.flags, (x, h0, c0, *params),
                                            (d_out, d_hn, d_cn))
        grads = lstm_backward(d_out, d_hn, d_cn, saved, x, h0, c0, params, *ctx.flags)
        return grads[0], grads[1], grads[2], None, *grads[3:]


def _differentiable_backward(flags, inputs, grad_outputs):
    """The backward under create_graph (double backward: gradgradcheck, gradient
    penalties): lstm_backward's scans have no derivative of their own, and returned as they
    are the gradients came back as constants, so a second backward gave zeros. Here
    PyTorch's composite runs the forward again under autograd, per step and layer, and its
    gradients carry their graph, as on the CPU."""
    has_biases, num_layers, bidirectional, batch_first = flags
    x, h0, c0, *params = inputs
    with torch.enable_grad():
        outs = torch.ops.aten.lstm.input.decompose(
            x, [h0, c0], list(params), has_biases, num_layers, 0.0, False, bidirectional,
            batch_first)
        wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
        got = torch.autograd.grad(outs, [inputs[i] for i in wanted], grad_outputs,
                                  create_graph=True, allow_unused=True)
    grads = [None] * len(inputs)
    for i, g in zip(wanted, got):
        grads[i] = g
    return grads[0], grads[1], grads[2], None, *grads[3:]


def scanned(inp, h0, c0, params, flags):
    """The scanned operator: with autograd when gradients are wanted, else the inference
    op, which saves nothing."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (inp, h0, c0, *params)):
        return _Scanned.apply(inp, h0, c0, flags, *params)
    return lstm(inp, h0, c0, list(params), *flags)


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
    return scanned(inp, hx[0], hx[1], params,
                   (has_biases, num_layers, bidirectional, batch_first))


library("aten", "IMPL").impl("lstm.input", _lstm_input, "AutogradPrivateUse1")
