"""Helion kernels on pjrt tensors (torch_pjrt.integrations.helion): our own add, softmax,
matmul and fused attention written in Helion's language, run (1) in Helion's reference mode,
whose PyTorch operations run on pjrt, against the same kernels on CPU tensors and plain
PyTorch, and (2) through Helion's Pallas backend, its JAX function registered with
`register_helion`, in every eager mode and compiled, with results on the device."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

helion = pytest.importorskip(
    "helion", reason="Helion is not installed (a test extra: pip install -e '.[helion]'; "
    "docs/custom-kernels.md)")
hl = pytest.importorskip("helion.language")

import jax.numpy as jnp  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.integrations.helion import jax_function, register_helion  # noqa: E402


# Our kernels in Helion's language. hl.tile splits the iteration space into tiles; a
# reference-mode tile spans the whole dimension, a Pallas tile one block of the config.
def add(x, y):
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] + y[tile]
    return out


def softmax(x):
    out = torch.empty_like(x)
    for rows in hl.tile(x.size(0)):
        shifted = x[rows, :] - torch.amax(x[rows, :], dim=1, keepdim=True)
        e = torch.exp(shifted)
        out[rows, :] = e / torch.sum(e, dim=1, keepdim=True)
    return out


def matmul(x, y):
    m, k = x.size()
    n = y.size(1)
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tm, tn in hl.tile([m, n]):
        acc = hl.zeros([tm, tn], dtype=torch.float32)
        for tk in hl.tile(k):
            acc = torch.addmm(acc, x[tm, tk], y[tk, tn])
        out[tm, tn] = acc.to(x.dtype)
    return out


def matmul_dot(x, y):
    m, k = x.size()
    n = y.size(1)
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tm, tn in hl.tile([m, n]):
        acc = hl.zeros([tm, tn], dtype=torch.float32)
        for tk in hl.tile(k):
            acc = hl.dot(x[tm, tk], y[tk, tn], acc=acc)
        out[tm, tn] = acc.to(x.dtype)
    return out


def attention(q, k, v):
    """Softmax attention over [B, H, L, E], keys in tiles with an online softmax (running
    maximum and sum), the scores never whole."""
    lq, e = q.size(2), hl.specialize(q.size(3))
    lk = k.size(2)
    qf, kf, vf = q.reshape(-1, lq, e), k.reshape(-1, lk, e), v.reshape(-1, lk, e)
    out = torch.empty_like(qf)
    scale = 1.0 / math.sqrt(e)
    for tb, tq in hl.tile([qf.size(0), lq]):
        m_i = hl.full([tb, tq], float("-inf"), dtype=torch.float32)
        l_i = hl.zeros([tb, tq], dtype=torch.float32)
        acc = hl.zeros([tb, tq, e], dtype=torch.float32)
        qb = qf[tb, tq, :]
        for tk in hl.tile(lk):
            s = torch.bmm(qb, kf[tb, tk, :].transpose(1, 2)) * scale
            m_new = torch.maximum(m_i, torch.amax(s, -1))
            p = torch.exp(s - m_new[:, :, None])
            alpha = torch.exp(m_i - m_new)
            l_i = l_i * alpha + torch.sum(p, -1)
            acc = torch.baddbmm(acc * alpha[:, :, None], p.to(vf.dtype), vf[tb, tk, :])
            m_i = m_new
        out[tb, tq, :] = (acc / l_i[:, :, None]).to(out.dtype)
    return out.view(q.size())


def cross_entropy(logits, target):
    """Per-row loss; the target's logit read with hl.load at computed flat indices."""
    n, v = logits.size()
    loss = torch.empty([n], dtype=torch.float32, device=logits.device)
    flat = logits.view(-1)
    for rows in hl.tile(n):
        lse = torch.logsumexp(logits[rows, :], dim=-1)
        loss[rows] = lse - hl.load(flat, [rows.index * v + target[rows]])
    return loss


def split_k_matmul(x, y):
    """Each (m, n, k) tile adds its partial product into the output with hl.atomic_add."""
    m, k = x.size()
    n = y.size(1)
    out = torch.zeros([m, n], dtype=torch.float32, device=x.device)
    for tm, tn, tk in hl.tile([m, n, k]):
        hl.atomic_add(out, [tm, tn], torch.mm(x[tm, tk], y[tk, tn]))
    return out


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# name: (kernel body, inputs, the plain PyTorch it computes). Helion 1.5.1's Pallas code
# fails on a dimension that is not a multiple of its block (test_pallas_ragged_block below):
# the Pallas cases' tiled dimensions are multiples of the implicit configs' blocks.
CASES = {
    "add": (add, lambda: (_randn(64, 72), _randn(64, 72)), torch.add),
    "softmax": (softmax, lambda: (_randn(24, 200),), lambda x: torch.softmax(x, 1)),
    "matmul": (matmul, lambda: (_randn(48, 40), _randn(40, 56)), torch.mm),
    "matmul_dot_bf16": (matmul_dot,
                        lambda: (_randn(32, 64, dtype=torch.bfloat16),
                                 _randn(64, 48, dtype=torch.bfloat16)),
                        lambda x, y: (x.float() @ y.float()).to(x.dtype)),
    "attention": (attention, lambda: tuple(_randn(2, 3, 64, 16) for _ in range(3)),
                  F.scaled_dot_product_attention),
}

# reference mode only: Helion 1.5.1's Pallas backend fails on these (docs/custom-kernels.md)
REF_ONLY = {
    "cross_entropy": (cross_entropy,
                      lambda: (_randn(24, 200), torch.randint(0, 200, (24,))),
                      lambda x, t: F.cross_entropy(x, t, reduction="none")),
    "split_k_matmul": (split_k_matmul, lambda: (_randn(48, 40), _randn(40, 56)), torch.mm),
}

REF = {name: helion.kernel(body, ref_mode=helion.RefMode.EAGER)
       for name, (body, _, _) in {**CASES, **REF_ONLY}.items()}


def _cpu_has_out_dtype_products() -> bool:
    """Whether this torch's CPU build has aten::mm.dtype (Helion's reference mode computes
    every product through it: torch.mm/bmm with out_dtype); 2.13's CPU build lacks it."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm.dtype", "CPU")


def _on_device_only():
    """Nothing went to the host and nothing fell back to the CPU since the test began."""
    metrics = torch_pjrt.metrics()
    assert metrics["cpu_fallbacks"] == {}
    assert metrics.get("device_to_host_bytes", 0) == 0


def _assert_close(got, expected):
    if expected.dtype == torch.bfloat16:
        torch.testing.assert_close(got, expected, atol=1e-2, rtol=1.6e-2)
    else:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [*CASES, *REF_ONLY])
def test_reference_mode_on_pjrt_tensors(name, eager_mode):
    _, inputs, torch_fn = {**CASES, **REF_ONLY}[name]
    args = inputs()
    got = REF[name](*[a.to("pjrt") for a in args])
    assert got.device.type == "pjrt"
    _on_device_only()
    got = got.cpu()
    _assert_close(got, torch_fn(*args))
    try:  # the same kernel on CPU tensors: the same operations in the same order
        on_cpu = REF[name](*args)
    except NotImplementedError as e:
        assert not _cpu_has_out_dtype_products(), e
        assert re.search(r"aten::b?mm\.dtype", str(e)), e
    else:
        torch.testing.assert_close(got, on_cpu, atol=1e-6, rtol=1e-6)


PALLAS = {name: helion.kernel(body, backend="pallas", autotune_effort="none")
          for name, (body, _, _) in CASES.items()}
# the same kernels for CPU tensors, which Helion runs in Pallas's interpreter when told
ON_CPU = {name: helion.kernel(body, backend="pallas", autotune_effort="none",
                              pallas_interpret=True)
          for name, (body, _, _) in CASES.items()}


def _define(name):
    """Operator `helion_test::<name>`: its PyTorch body (CPU tensors) is the plain PyTorch,
    its pjrt kernel the Helion kernel (Pallas backend)."""
    _, inputs, torch_fn = CASES[name]
    params = ", ".join(f"Tensor a{i}" for i in range(len(inputs())))
    op = torch.library.custom_op(f"helion_test::{name}", lambda *a: torch_fn(*a).clone(),
                                 mutates_args=(), schema=f"({params}) -> Tensor")
    op.register_fake(lambda *a: torch_fn(*a).new_empty(torch_fn(*a).shape))
    register_helion(op, PALLAS[name])
    return op


OPS = {name: _define(name) for name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_pallas_backend_through_register_jax(name, eager_mode):
    _, inputs, torch_fn = CASES[name]
    args = inputs()
    got = OPS[name](*[a.to("pjrt") for a in args])
    assert got.device.type == "pjrt"
    _on_device_only()
    got = got.cpu()
    _assert_close(got, torch_fn(*args))
    # the same kernel on CPU tensors, through Helion's own launcher
    _assert_close(got, ON_CPU[name](*args))


def test_jax_function_interprets_off_a_tpu():
    """Helion's Pallas code calls Mosaic's TPU pipeline unless its pallas_interpret is set
    ('Unsupported TPU device kind: cpu' on XLA:CPU): jax_function sets it and drops what
    Helion compiled without it."""
    kernel = helion.kernel(add, backend="pallas", autotune_effort="none")
    assert not kernel.settings.pallas_interpret
    x, y = _randn(64, 72), _randn(64, 72)
    got = jax_function(kernel)(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    assert kernel.settings.pallas_interpret
    torch.testing.assert_close(torch.from_numpy(np.array(got)), x + y)


@pytest.mark.parametrize("name", ["softmax", "attention"])
def test_pallas_backend_compiled_fullgraph(name):
    _, inputs, torch_fn = CASES[name]
    args = inputs()

    def f(*a):
        return OPS[name](*[t * 2 for t in a]) + 1

    compiled = torch.compile(f, backend="pjrt", fullgraph=True, dynamic=False)
    got = compiled(*[a.to("pjrt") for a in args])
    assert got.device.type == "pjrt"
    _on_device_only()
    _assert_close(got.cpu(), torch_fn(*[a * 2 for a in args]) + 1)


def test_no_gradient_without_a_formula():
    """JAX cannot differentiate Helion's Pallas kernels: register_helion installs no
    jax.vjp backward, and the op's backward raises (custom_op's error) instead of a zero."""
    x, y = (t.to("pjrt").requires_grad_() for t in CASES["add"][1]())
    out = OPS["add"](x, y)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_64_bit_inputs_are_refused(dtype):
    """Helion's Pallas kernels are 32-bit: a float64 block would loop forever in Pallas's
    tiling, so register_helion refuses it (and int64) with the argument's name."""
    x = torch.ones(64, 72, dtype=dtype, device="pjrt")
    with pytest.raises(TypeError, match=f"argument 0, is {str(dtype)[6:]}"):
        OPS["add"](x, x)


def test_a_kernel_of_another_backend_is_refused():
    triton_kernel = helion.kernel(add, backend="triton")
    with pytest.raises(ValueError, match="'triton' backend; only backend='pallas'"):
        register_helion("helion_test::add", triton_kernel)


@pytest.mark.xfail(raises=TypeError, strict=True, reason=(
    "Helion 1.5.1, Pallas backend: a dimension that is not a multiple of its block (40 rows "
    "in blocks of 32) fails while Helion traces the kernel, on CPU tensors as on pjrt: "
    "'Shapes must be 1D sequences of concrete values of integer type, got "
    "(JitTracer(~int32[]), 72)' (Mosaic's pipeline sizes the last block with a traced value)"))
def test_pallas_ragged_block():
    kernel = helion.kernel(add, backend="pallas", autotune_effort="none",
                           pallas_interpret=True)
    x, y = _randn(40, 72), _randn(40, 72)
    kernel(x, y)
