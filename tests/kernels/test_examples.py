"""The shipped Pallas kernels (torch_pjrt.kernels.examples), run in Pallas's interpreter on
XLA:CPU: values and gradients against CPU PyTorch in every eager mode and compiled, opcheck,
and F.scaled_dot_product_attention's selection of the flash-attention kernels."""

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu
from tolerance import SIDES

import torch_pjrt
from torch_pjrt.kernels import examples
from torch_pjrt.kernels.examples import cross_entropy, flash
from torch_pjrt.lowering.families import attention


def _pjrt(*ts):
    return [t.detach().to("pjrt").requires_grad_(t.requires_grad) for t in ts]


def _close(got, expected, **tol):
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), **tol)


def _on_cpu(fn, tensors, cotangent, dtype):
    """fn's output and its inputs' gradients on the CPU, computed in `dtype`: float32 is
    what the kernels are compared with, float64 the reference both are measured against
    (tests/tolerance.py: the kernels sum in their own block order)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(cotangent.to(dtype))
    return [out.detach()] + [t.grad for t in leaves]


def _as_accurate(fn, tensors, cotangent, actual):
    assert_as_accurate_as_cpu([a.detach() for a in actual],
                              _on_cpu(fn, tensors, cotangent, torch.float32),
                              _on_cpu(fn, tensors, cotangent, torch.float64))


def test_rms_norm_forward_and_backward(eager_mode):
    x = torch.randn(5, 3, 48, requires_grad=True)  # 15 rows: a padded row block
    w = torch.randn(48, requires_grad=True)
    y = F.rms_norm(x, (48,), w, eps=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    dx, dw = _pjrt(x, w)
    dy = examples.rms_norm(dx, dw, 1e-5)
    dy.backward(g.to("pjrt"))
    _as_accurate(lambda x, w: F.rms_norm(x, (48,), w, eps=1e-5), (x, w), g,
                 [dy, dx.grad, dw.grad])
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


def test_softmax_cross_entropy_forward_and_backward(eager_mode):
    logits = torch.randn(10, 1100, requires_grad=True)  # 3 vocabulary blocks, the last partial
    target = torch.randint(0, 1100, (10,))
    target[3] = -100
    loss = F.cross_entropy(logits, target, reduction="none")
    g = torch.rand(10)
    loss.backward(g)
    (dl,) = _pjrt(logits)
    dloss = examples.softmax_cross_entropy(dl, target.to("pjrt"))
    dloss.backward(g.to("pjrt"))
    _close(dloss, loss)
    _close(dl.grad, logits.grad)
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_forward_and_backward(eager_mode, causal, monkeypatch):
    monkeypatch.setattr(flash, "QUERIES", 16)  # several blocks, the last partial
    monkeypatch.setattr(flash, "KEYS", 16)
    s = 40 if causal else 24  # cross attention: 40 queries over 24 keys
    q = torch.randn(2, 2, 40, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, s, 16, requires_grad=True) for _ in range(2))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    g = torch.randn_like(out)
    out.backward(g)
    dq, dk, dv = _pjrt(q, k, v)
    dout = examples.flash_attention(dq, dk, dv, causal)
    dout.backward(g.to("pjrt"))
    _as_accurate(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                 (q, k, v), g, [dout, dq.grad, dk.grad, dv.grad])
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


def test_opcheck_and_compiled():
    x, w = torch.randn(6, 32), torch.randn(32)
    logits, target = torch.randn(6, 700), torch.randint(0, 700, (6,))
    q, k, v = (torch.randn(1, 2, 24, 8) for _ in range(3))
    cases = [(torch.ops.pjrt_kernels.rms_norm.default, (*_pjrt(x, w), 1e-6)),
             (torch.ops.pjrt_kernels.softmax_cross_entropy.default,
              (*_pjrt(logits, target), -100)),
             (torch.ops.pjrt_kernels.flash_attention.default, (*_pjrt(q, k, v), True, 0.5))]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                    "test_aot_dispatch_dynamic"))

    def loss(x, w, logits, target):
        h = examples.rms_norm(x, w)
        return examples.softmax_cross_entropy(logits * h.sum(), target).mean()

    torch._dynamo.reset()
    args = [x.requires_grad_(), w.requires_grad_(), logits.requires_grad_(), target]
    expected = loss(*args)
    expected.backward()
    dargs = _pjrt(*args)
    got = torch.compile(loss, backend="pjrt", fullgraph=True)(*dargs)
    got.backward()
    wide = [t.detach().double().requires_grad_() for t in args[:3]] + [target]
    reference = loss(*wide)
    reference.backward()
    # every gradient of x and w is scaled by one shared sum of 4,200 products (the loss's
    # factor h.sum()): where the CPU happens to round that sum exactly its error is 0, so
    # the floor is sum_bound's for that sum, relative: both sides, one rounding per term
    shared_sum = SIDES * (1 + logits.numel())
    assert_as_accurate_as_cpu([got.detach()] + [a.grad for a in dargs[:3]],
                              [expected.detach()] + [b.grad for b in args[:3]],
                              [reference.detach()] + [b.grad for b in wide[:3]],
                              ulps=shared_sum)
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 2 and m.get("compile_eager_graphs", 0) == 0


def test_cross_entropy_keeps_no_probabilities():
    """Outside the Pallas kernel, the forward computes nothing of the logits' size: the
    [rows, vocabulary] work is all inside the kernel, block by block."""
    jaxpr = jax.make_jaxpr(cross_entropy.forward)(jnp.zeros((16, 2048)),
                                                  jnp.zeros((16,), jnp.int32))
    sizes = [v.aval.size for e in jaxpr.eqns if e.primitive.name != "pallas_call"
             for v in e.outvars]
    assert max(sizes, default=0) < 16 * 2048
    assert [e.primitive.name for e in jaxpr.eqns].count("pallas_call") == 1


# ------------------------------------------------------------------ SDPA's selection
def _sdpa_jaxpr(causal):
    q = jax.ShapeDtypeStruct((1, 2, 48, 8), jnp.float32)
    return str(jax.make_jaxpr(lambda q, k, v: attention.sdpa_fused_overrideable(
        q, k, v, is_causal=causal, key=jax.random.key(0)))(q, q, q))


def test_sdpa_selects_flash_attention_where_pallas_is_native(monkeypatch):
    monkeypatch.setattr(flash, "QUERIES", 16)
    monkeypatch.setattr(flash, "KEYS", 16)
    assert "pallas_call" not in _sdpa_jaxpr(True)  # XLA:CPU: SDPA's own lowering
    monkeypatch.setattr(flash, "selected", lambda: True)
    assert "pallas_call" in _sdpa_jaxpr(True)
    # and through F.scaled_dot_product_attention (interpreted here), forward and backward
    q, k, v = (torch.randn(1, 3, 48, 8, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    dq, dk, dv = _pjrt(q, k, v)
    dout = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    dout.sum().backward()
    _as_accurate(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 (q, k, v), torch.ones_like(out), [dout, dq.grad, dk.grad, dv.grad])
    # a mask, dropout, partial blocks or another head dimension keep SDPA's own lowering
    x = jax.ShapeDtypeStruct((1, 2, 48, 8), jnp.float32)
    assert flash.SDPAKernel.applies(x, x, x, None, 0.0)
    mask = jax.ShapeDtypeStruct((48, 48), jnp.bool_)
    assert not flash.SDPAKernel.applies(x, x, x, mask, 0.0)
    assert not flash.SDPAKernel.applies(x, x, x, None, 0.1)
    for shape in ((1, 2, 40, 8), (1, 2, 48, 12)):
        y = jax.ShapeDtypeStruct(shape, jnp.float32)
        assert not flash.SDPAKernel.applies(y, y, y, None, 0.0)
