"""Scaled dot-product attention: the eager math path, the fused-op lowering, _safe_softmax."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import (
    SLOW_TESTS,
    assert_as_accurate_as_cpu,
    assert_same,
    float64,
    outputs_and_grads,
    pytest_without_cpu_kernels,
    to_device,
)
from opinfo_diff import check_samples, fallbacks_of
from tolerance import assert_as_accurate

import torch_pjrt
from torch_pjrt.lowering.families import attention

aten = torch.ops.aten
ATTENTION_OPS = ("softmax", "bmm", "attention")
NEG_INF = float("-inf")

B, H, L, S, E = 2, 4, 7, 9, 8


def _qkv(heads_kv=H, batch=(B,)):
    return (torch.randn(*batch, H, L, E), torch.randn(*batch, heads_kv, S, E),
            torch.randn(*batch, heads_kv, S, 6))


def _masked_row_mask():
    mask = torch.ones(L, S, dtype=torch.bool)
    mask[2] = False  # a query that sees no key: zeros out (as _safe_softmax gives)
    return mask


# name -> (q, k, v, attn_mask, kwargs)
CASES = {
    "plain": (*_qkv(), None, {}),
    "causal": (*_qkv(), None, {"is_causal": True}),
    "scale": (*_qkv(), None, {"scale": 0.3}),
    "float_mask": (*_qkv(), torch.randn(L, S), {}),
    "float_mask_per_head": (*_qkv(), torch.randn(B, H, L, S), {}),
    "bool_mask": (*_qkv(), torch.rand(B, 1, L, S) > 0.3, {}),
    "fully_masked_row": (*_qkv(), _masked_row_mask(), {}),
    "gqa": (*_qkv(heads_kv=2), None, {"enable_gqa": True}),
    "gqa_causal": (*_qkv(heads_kv=2), None, {"enable_gqa": True, "is_causal": True}),
    "causal_scale_dropout_free": (*_qkv(), None, {"is_causal": True, "scale": 0.5}),
    "unbatched": (*_qkv(batch=()), None, {}),
}


MODES = ("strict", "fused", "debug", "compile")


def _in_mode(mode, fn):
    """fn run in an eager mode, or compiled (backend="pjrt") for "compile"."""
    if mode == "compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="pjrt")

    def run(*args):
        with torch_pjrt.set_eager_mode(mode):
            return fn(*args)
    return run


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_matches_cpu(case, mode):
    """F.scaled_dot_product_attention as users call it: forward and every input's
    gradient (a float mask's too) equal the CPU's, in every mode."""
    q, k, v, mask, kw = CASES[case]
    tensors = (q, k, v) if mask is None else (q, k, v, mask)

    def fn(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    actual = outputs_and_grads(_in_mode(mode, fn), *to_device(tensors))
    assert_as_accurate_as_cpu(actual, outputs_and_grads(fn, *tensors),
                              outputs_and_grads(fn, *float64(tensors)))
    assert not fallbacks_of(ATTENTION_OPS)


@pytest.mark.parametrize("mode", MODES)
def test_sdpa_dropout_statistics_seed_and_backward(mode):
    """Dropout keeps each probability with chance 1 - p, scaled by 1 / (1 - p); the same
    seed gives the same mask, and the backward uses the mask the forward drew. With q = k = 0
    every probability is 1/S and v = I makes the output the dropped probabilities."""
    p, n = 0.3, 64
    q, k = torch.zeros(2, 4, n, 8), torch.zeros(2, 4, n, 8)
    v = torch.eye(n).expand(2, 4, n, n).contiguous()
    fn = _in_mode(mode, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p))

    def run(seed):
        torch.manual_seed(seed)
        leaves = [t.detach().clone().requires_grad_() for t in to_device((q, k, v))]
        out = fn(*leaves)
        out.sum().backward()
        return out.detach().cpu(), leaves[2].grad.cpu()

    out, v_grad = run(5)
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.02  # 32768 draws: 4.5 sigma
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (n * (1 - p))))
    # d(sum(D @ I)) / dv = D^T @ ones: each key's column sum of the dropped probabilities
    torch.testing.assert_close(v_grad, out.sum(-2, keepdim=True).transpose(-1, -2).expand(
        -1, -1, -1, n))
    again, again_grad = run(5)
    assert torch.equal(again, out) and torch.equal(again_grad, v_grad)
    assert not torch.equal(run(6)[0], out)


def _ops_called(fn, *args) -> tuple[set[str], object]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Log() as log:
        result = fn(*args)
    return log.names, result


@pytest.mark.parametrize("backend,fused", [
    ("MATH", False), ("OVERRIDEABLE", True), ("FLASH_ATTENTION", True),
    ("EFFICIENT_ATTENTION", True), ("CUDNN_ATTENTION", True)])
def test_sdpa_kernel_context_picks_the_path(backend, fused):
    """torch.nn.attention.sdpa_kernel: MATH runs the decomposition; the fused backends a
    CUDA script asks for (flash, memory-efficient, cuDNN) and OVERRIDEABLE run the lowered
    fused kernel; both give the CPU's result."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(heads_kv=2)

    def fn(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.sum().backward()
        return out.detach(), q.grad, k.grad, v.grad

    expected = fn(*[t.detach().requires_grad_() for t in (q, k, v)])
    reference = fn(*[t.detach().double().requires_grad_() for t in (q, k, v)])
    leaves = [t.detach().to("pjrt").requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(getattr(SDPBackend, backend)):
        names, actual = _ops_called(fn, *leaves)
    assert ("_scaled_dot_product_fused_attention_overrideable" in names) == fused, names
    assert_as_accurate_as_cpu(list(actual), list(expected), list(reference))


def test_safe_softmax_zeroes_fully_masked_rows():
    x = torch.randn(3, 4, 5)
    x[0, 1] = NEG_INF
    x[2, :, 3] = NEG_INF
    for dim, dtype in ((-1, None), (1, None), (-1, torch.float64)):
        assert_same(aten._safe_softmax(to_device(x), dim, dtype), aten._safe_softmax(x, dim, dtype))


def test_opinfo_samples():
    # dropout samples draw different random numbers on each device
    assert check_samples("nn.functional.scaled_dot_product_attention",
                         skip=lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
                         accuracy=True) > 0
    assert check_samples("torch.ops.aten._safe_softmax.default") > 0


# ------------------------------------------------------------- the fused op
def _jax(t):
    return None if t is None else jnp.asarray(t.detach().numpy())


def _torch(a):
    return None if a is None else torch.from_numpy(np.asarray(a))


def _fused_lowering(q, k, v, bias, is_causal, scale, cot):
    """The fused op's lowering and its backward's, run as plain JAX functions."""
    bias = None if bias is None else _jax(bias)
    out, lse, _, _, seed, offset, _ = attention.sdpa_fused_overrideable(
        _jax(q), _jax(k), _jax(v), bias, 0.0, is_causal, False, scale=scale,
        key=jax.random.key(0))
    grads = attention.sdpa_fused_overrideable_backward(
        _jax(cot), _jax(q), _jax(k), _jax(v), bias, [True] * 4, out, lse, None, None, L, S, 0.0,
        is_causal, seed, offset, scale=scale)
    return [_torch(out)] + [_torch(g) for g in grads]


@pytest.fixture(params=["dense", "chunked", "query_blocks", "query_blocks_chunked"])
def strategy(request, monkeypatch):
    if "chunked" in request.param:  # blocks of 4 keys: 9 keys make 3 blocks, one padded
        monkeypatch.setattr(attention, "DENSE_SCORES_LIMIT", 0)
        monkeypatch.setattr(attention, "KEY_BLOCK", 4)
    if "query_blocks" in request.param:  # causal: 7 queries in blocks of 3, 3 and 1
        monkeypatch.setattr(attention, "QUERY_BLOCK_MIN", 2)
    return request.param


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_attention_lowering(case, strategy):
    q, k, v, mask, kw = CASES[case]
    cot = torch.randn(q.shape[:-1] + (v.shape[-1],))
    float_mask = mask is not None and mask.is_floating_point()

    def torch_sdpa(dtype):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        mask_leaf = mask.detach().to(dtype).requires_grad_(True) if float_mask else mask
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask_leaf, **kw)
        out.backward(cot.to(dtype))
        return [out] + [t.grad for t in leaves] + [mask_leaf.grad if float_mask else None]

    expected, reference = torch_sdpa(torch.float32), torch_sdpa(torch.float64)
    actual = _fused_lowering(q, k, v, mask, kw.get("is_causal", False), kw.get("scale"), cot)
    for a, e, r in zip(actual, expected, reference):
        if e is not None:
            assert_as_accurate(a, e.detach(), r.detach())


def test_fused_attention_causal_with_a_bias(strategy):
    # F.scaled_dot_product_attention takes a mask or is_causal; the op can get both.
    q, k, v = _qkv(heads_kv=2)
    bias = torch.randn(B, 1, L, S)
    causal = torch.ones(L, S, dtype=torch.bool).tril()
    combined = bias.masked_fill(~causal, NEG_INF)
    cot = torch.randn(q.shape[:-1] + (v.shape[-1],))

    def torch_sdpa(dtype):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, combined)]
        out = F.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3], enable_gqa=True)
        out.backward(cot.to(dtype))
        found = [out.detach()] + [t.grad for t in leaves]
        found[-1] = found[-1].masked_fill(~causal, 0)
        return found

    actual = _fused_lowering(q, k, v, bias, True, None, cot)
    for a, e, r in zip(actual, torch_sdpa(torch.float32), torch_sdpa(torch.float64)):
        assert_as_accurate(a, e, r)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_dropout_backward_matches_its_forward(strategy, causal):
    if not SLOW_TESTS and (strategy, causal) not in (("dense", False),
                                                     ("query_blocks_chunked", True)):
        pytest.skip("slow sweep: CI runs the plainest and the most blocked strategy; "
                    "set TORCH_PJRT_SLOW_TESTS=1 for all")
    q, k, v = (_jax(t) for t in _qkv())
    key = jax.random.key(7)

    def forward(q):
        return attention.sdpa_fused_overrideable(q, k, v, None, 0.4, causal, False, key=key)

    out, lse, _, _, seed, offset, _ = forward(q)
    dq = attention.sdpa_fused_overrideable_backward(
        jnp.ones_like(out), q, k, v, None, [True] * 4, out, lse, None, None, L, S, 0.4, causal,
        seed, offset)[0]
    expected = jax.grad(lambda q: jnp.sum(forward(q)[0]))(q)
    np.testing.assert_allclose(np.asarray(dq), np.asarray(expected), atol=1e-4, rtol=1e-4)


def test_fused_attention_op_on_device():
    q, k, v = _qkv()
    out = aten._scaled_dot_product_fused_attention_overrideable(*to_device((q, k, v)))[0]
    assert_as_accurate_as_cpu(out, F.scaled_dot_product_attention(q, k, v),
                              F.scaled_dot_product_attention(*float64((q, k, v))))


# ------------------------------------------------------ a transformer block
class AttentionBlock(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


@pytest.mark.usefixtures("eager_mode")
def test_attention_block_forward_backward_matches_cpu():
    torch.manual_seed(0)
    block = AttentionBlock()
    x = torch.randn(2, 10, 32)
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    results = []
    for device, dtype in (("cpu", torch.float32), ("pjrt", torch.float32),
                          ("cpu", torch.float64)):
        m = copy.deepcopy(block).to(device, dtype)
        xd = x.detach().to(device, dtype).requires_grad_()
        out = m(xd)
        out.pow(2).mean().backward()
        results.append([out, xd.grad] + [p.grad for p in m.parameters()])
    assert_as_accurate_as_cpu(results[1], results[0], results[2])
    assert torch_pjrt.metrics()["cpu_fallbacks"] == before


def test_eager_sdpa_takes_the_lowered_fused_kernel():
    import torch_pjrt

    q, k, v = _qkv()
    torch_pjrt.counters.reset()
    dq, dk, dv = (t.detach().to("pjrt").requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    out.sum().backward()
    found = []
    for dtype in (torch.float32, torch.float64):
        ref_q = q.detach().to(dtype).requires_grad_()
        ref = F.scaled_dot_product_attention(ref_q, k.to(dtype), v.to(dtype), is_causal=True)
        ref.sum().backward()
        found.append([ref.detach(), ref_q.grad])
    assert_as_accurate_as_cpu([out.detach(), dq.grad], *found)
    assert "softmax" not in " ".join(torch_pjrt.counters._counters)  # not the math path


# ------------------------------------------------ attention over a growing key/value cache
# (queries, keys, key/value heads, is_causal): fewer queries than keys, the calls that pad
# the cache to a bucket of lengths (eager/dispatch.py) and run pjrt::attention_prefix
CACHE_CASES = {
    "decode, keys padded 17 -> 20": (1, 17, H, False),
    "decode, a bucket's own length": (1, 20, H, False),
    "decode, padded 21 -> 24, causal": (1, 21, H, True),
    "decode, grouped heads": (1, 33, 2, False),
    "a chunk after cached tokens, causal": (3, 30, H, True),
}


def _programs_of(name: str) -> set:
    """The digests of the programs described so far whose op is `name` (strict mode: one
    program an op signature)."""
    from torch_pjrt.runtime import watch
    return {d for d, p in watch._programs.items() if p.title.startswith(name)}


@pytest.mark.parametrize("mode", ("strict", "fused", "debug"))
@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_attention_over_a_growing_cache_match_cpu(case, mode):
    """The padded keys' attention over the true length equals the CPU's SDPA on the
    unpadded cache: bit for bit where XLA:CPU runs ATen's kernel (the same kernel over the
    same rows), to float32 rounding on the pure-XLA path
    (test_attention_over_a_growing_cache_pure_xla_too); the
    gradients flow through the op that was called."""
    from torch_pjrt.runtime import cpu_kernels

    lq, s, hk, causal = CACHE_CASES[case]
    g = torch.Generator().manual_seed(s)
    q, k, v = (torch.randn(B, h, n, E, generator=g) for h, n in ((H, lq), (hk, s), (hk, s)))
    kw = {"is_causal": causal}
    if hk != H:  # (PyTorch's SDPA repeats grouped keys itself only when asked)
        k, v = k.repeat_interleave(H // hk, 1), v.repeat_interleave(H // hk, 1)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    want, *want_grads = outputs_and_grads(sdpa, q, k, v)
    with torch_pjrt.set_eager_mode(mode):
        got, *grads = outputs_and_grads(sdpa, *to_device([q, k, v]))
    if cpu_kernels.available():
        assert torch.equal(got.cpu(), want)
    else:
        assert_same(got, want, scale=4 * s)
    for a, b in zip(grads, want_grads):
        assert_same(a, b, scale=4 * s)


def test_a_growing_cache_compiles_one_attention_program_per_bucket():
    """A decode loop over key lengths 17..48 compiles the attention once per bucket
    (20, 24, 28, 32, 40, 48: TORCH_PJRT_BUCKETS' default), not once per length; the
    padding runs on programs of its own (or, in fused eager, on the host)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, 1, E, generator=g)
    cache = torch.randn(1, H, 48, E, generator=g)
    prefix, sdpa = "pjrt.attention_prefix", "aten._scaled_dot_product_fused_attention"
    before = _programs_of(prefix), _programs_of(sdpa)
    with torch_pjrt.set_eager_mode("strict"):
        for s in range(17, 49):
            got = F.scaled_dot_product_attention(to_device(q), to_device(cache[:, :, :s]),
                                                 to_device(cache[:, :, :s]))
            want = F.scaled_dot_product_attention(q, cache[:, :, :s], cache[:, :, :s])
            assert_same(got, want, scale=4 * s)
    assert 1 <= len(_programs_of(prefix) - before[0]) <= 6
    assert not _programs_of(sdpa) - before[1]


def test_attention_over_a_growing_cache_pure_xla_too():
    """The growing-cache tests above again with TORCH_PJRT_CPU_KERNELS=0: the padded op's
    pure-XLA path (the keys past the true length masked out), what GPUs and TPUs run."""
    out = pytest_without_cpu_kernels(__file__, "growing_cache and not pure_xla")
    assert "16 passed" in out, out[-500:]
