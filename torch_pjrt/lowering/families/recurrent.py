"""The fused LSTM and GRU cells (and their backward ops) that nn.LSTM / nn.GRU call on
every device but the CPU, which has no kernel for them to fall back to.

The workspace each forward returns is read only by its own backward: the LSTM's holds
the activated gates (input, forget, cell, output); the GRU's the reset, update and new
gates, the previous hidden state and the hidden part of the new gate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..registry import lower
from ._ops import aten


def _upcast(x):
    """Half-precision gates compute in float32, as PyTorch's fused kernels do."""
    return None if x is None else \
        x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, parts):
    gates = _upcast(input_gates) + _upcast(hidden_gates)
    for bias in (input_bias, hidden_bias):
        if bias is not None:
            gates = gates + _upcast(bias)
    return jnp.split(gates, parts, axis=1)


@lower(aten._thnn_fused_lstm_cell.default)
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _upcast(cx) + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(_upcast(workspace), 4, axis=1)
    cx, cy = _upcast(cx), _upcast(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else _upcast(grad_hy)
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else _upcast(grad_cy)
    tanh_cy = jnp.tanh(cy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy  # through cy, both paths
    grad_gates = jnp.concatenate([
        grad_c * g * (1 - i) * i,
        grad_c * cx * (1 - f) * f,
        grad_c * i * (1 - g * g),
        grad_hy * tanh_cy * (1 - o) * o,
    ], axis=1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@lower(aten._thnn_fused_gru_cell.default)
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    xr, xz, xn = jnp.split(_upcast(input_gates) + _bias(input_bias), 3, axis=1)
    hr, hz, hn = jnp.split(_upcast(hidden_gates) + _bias(hidden_bias), 3, axis=1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    hx = _upcast(hx)
    hy = n + z * (hx - n)
    return hy, jnp.concatenate([r, z, n, hx, hn], axis=1)


def _bias(bias):
    return 0 if bias is None else _upcast(bias)


@lower(aten._thnn_fused_gru_cell_backward.default)
def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = jnp.split(_upcast(workspace), 5, axis=1)
    grad_hy = _upcast(grad_hy)
    grad_n = grad_hy * (1 - z) * (1 - n * n)  # before the tanh
    grad_r = grad_n * hn * (1 - r) * r
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], axis=1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


# -- meta kernels: PyTorch's LSTM one fails when the cell has no biases, the GRU has none

def _check_sizes(op, input_gates, hidden_gates, input_bias, hidden_bias, factor, prev):
    """The size checks of PyTorch's fused cells (their messages), biases optional."""
    batch, hidden = prev.shape[0], prev.shape[-1]
    want = (batch, factor * hidden)
    for name, t in (("input_gates", input_gates), ("hidden_gates", hidden_gates)):
        if tuple(t.shape) != want:
            raise RuntimeError(f"{op}: {name} has size {list(t.shape)}, expected "
                               f"{list(want)} (batch, {factor} x hidden size)")
    for name, t in (("input_bias", input_bias), ("hidden_bias", hidden_bias)):
        if t is not None and tuple(t.shape) != (factor * hidden,):
            raise RuntimeError(f"{op}: {name} has size {list(t.shape)}, expected "
                               f"[{factor * hidden}]")


def _lstm_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    _check_sizes("_thnn_fused_lstm_cell", input_gates, hidden_gates, input_bias,
                 hidden_bias, 4, cx)
    return (torch.empty_like(cx, memory_format=torch.contiguous_format),
            torch.empty_like(cx, memory_format=torch.contiguous_format),
            torch.empty_like(input_gates, memory_format=torch.contiguous_format))


def _gru_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    _check_sizes("_thnn_fused_gru_cell", input_gates, hidden_gates, input_bias,
                 hidden_bias, 3, hx)
    return (torch.empty_like(hx, memory_format=torch.contiguous_format),
            hx.new_empty((hx.shape[0], 5 * hx.shape[1])))


def _gru_backward_meta(grad_hy, workspace, has_bias):
    batch, hidden = grad_hy.shape
    gates = grad_hy.new_empty((batch, 3 * hidden))
    bias = grad_hy.new_empty((3 * hidden,)) if has_bias else None
    return gates, torch.empty_like(gates), torch.empty_like(grad_hy), bias, \
        None if bias is None else torch.empty_like(bias)


def _register_metas() -> None:
    lib = torch.library.Library("aten", "IMPL", "Meta")
    lib.impl("_thnn_fused_lstm_cell", _lstm_meta)  # replaces PyTorch's (no-bias bug)
    for name, fn in (("_thnn_fused_gru_cell", _gru_meta),
                     ("_thnn_fused_gru_cell_backward", _gru_backward_meta)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, fn)
    _meta_libs.append(lib)


_meta_libs: list = []
_register_metas()
