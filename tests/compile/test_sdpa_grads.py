"""Gradients of scaled_dot_product_attention under torch.compile: values and strides as
CPU eager's (and eager pjrt's), for the layouts models give q, k and v."""

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_as_accurate


def _layout(t: torch.Tensor) -> tuple:
    """Strides where they matter: a dimension of size 1 has any (compiled GQA gradients of
    one key/value head give it the next dimension's extent, eager its own stride)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n != 1)


def _qkv(layout: str, q, k, v):
    if layout == "bshd":  # transposes of (batch, seq, heads, dim), as HF models make them
        return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    return [q, k, v]


def _grads(device: str, compiled: bool, layout: str, inputs, dtype=torch.float32, **kwargs):
    leaves = [t.detach().to(device, dtype).requires_grad_() for t in _qkv(layout, *inputs)]
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)  # noqa: E731
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="pjrt")
    out = fn(*leaves)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device, dtype))
    return [t.grad for t in leaves]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"enable_gqa": True}],
                         ids=["causal", "gqa"])
def test_sdpa_gradients_compiled_match_eager_strides(layout, kwargs):
    torch.manual_seed(0)
    kv_heads = 1 if kwargs.get("enable_gqa") else 4
    inputs = [torch.randn(2, 4, 5, 8), torch.randn(2, kv_heads, 5, 8),
              torch.randn(2, kv_heads, 5, 8)]
    cpu = _grads("cpu", False, layout, inputs, **kwargs)
    eager = _grads("pjrt", False, layout, inputs, **kwargs)
    compiled = _grads("pjrt", True, layout, inputs, **kwargs)
    wide = _grads("cpu", False, layout, inputs, torch.float64, **kwargs)
    for c, e, m, r in zip(cpu, eager, compiled, wide):
        assert_as_accurate(m.cpu(), c, r)  # (tests/tolerance.py: against float64)
        assert _layout(m) == _layout(e) == _layout(c)


def test_sdpa_gradient_through_a_fused_qkv_projection():
    """q, k and v as views of one projection (saved activations of the forward graph)."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 16), torch.randn(48, 16)

    def step(x, w):
        b, s, _ = x.shape
        q, k, v = (x @ w.t()).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    leaves = [t.clone().requires_grad_() for t in (x, w)]
    step(*leaves).backward()
    wide = [t.double().requires_grad_() for t in (x, w)]
    step(*wide).backward()
    dev = [t.to("pjrt").requires_grad_() for t in (x, w)]
    torch.compile(step, backend="pjrt")(*dev).backward()
    for d, c, r in zip(dev, leaves, wide):
        assert_as_accurate(d.grad.cpu(), c.grad, r.grad)
        assert _layout(d.grad) == _layout(c.grad)
