"""Dynamic sizes padded to buckets: one program per bucket, results equal to CPU PyTorch."""

import copy

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu

import torch_pjrt
from torch_pjrt.compile import buckets
from torch_pjrt.demo.model import GPT, GPTConfig


def _programs() -> int:
    return torch_pjrt.metrics().get("bucketed_graph_programs", 0)


def _dynamic(t: torch.Tensor, dim: int) -> torch.Tensor:
    t = t.to("pjrt")
    torch._dynamo.mark_dynamic(t, dim)
    return t


def test_bucket_policy():
    assert [buckets.bucket(n) for n in (2, 3, 5, 8, 9, 16)] == [2, 4, 8, 8, 16, 16]
    assert [buckets.bucket(n) for n in (17, 21, 30, 33, 64, 65, 1000, 1025)] == \
        [20, 24, 32, 40, 64, 80, 1024, 1280]
    assert buckets.bucket(100, steps=1) == 128
    for n in range(2, 5000):
        b = buckets.bucket(n)
        assert n <= b and (n <= 16 or b <= 1.25 * n)


def _float64(module: nn.Module) -> nn.Module:
    """The model's float64 copy: padded programs are held to be as accurate as the CPU
    against it (tests/tolerance.py), on any processor."""
    return copy.deepcopy(module).double()


def _mlp():
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def test_mlp_inference_one_program_per_bucket():
    model = _mlp()
    fn = torch.compile(copy.deepcopy(model).to("pjrt"), backend="pjrt")
    wide = _float64(model)
    with torch.no_grad():
        for b in (3, 5, 7, 8):  # buckets 4, 8, 8, 8
            x = torch.randn(b, 8)
            assert_as_accurate_as_cpu(fn(_dynamic(x, 0)), model(x), wide(x.double()))
    assert _programs() == 2
    assert torch_pjrt.metrics().get("bucket_fallback_graphs", 0) == 0


def test_mlp_training_gradients_match():
    torch.manual_seed(0)
    model = _mlp()
    dev = copy.deepcopy(model).to("pjrt")
    fn = torch.compile(dev, backend="pjrt")
    wide = _float64(model)
    for b in (3, 5, 7, 8):
        x, y = torch.randn(b, 8), torch.randn(b, 4)
        F.mse_loss(model(x), y).backward()
        F.mse_loss(wide(x.double()), y.double()).backward()
        F.mse_loss(fn(_dynamic(x, 0)), y.to("pjrt")).backward()
        assert_as_accurate_as_cpu(*([p.grad for p in m.parameters()] for m in (dev, model, wide)))
    assert _programs() == 4  # forward and backward, two buckets


def _gpt_step(sizes, dim: int, train: bool = True):
    """Logits, loss and gradients of the demo GPT (embedding, layer norm, causal SDPA,
    cross-entropy) against CPU for each (batch, seq) with `dim` dynamic."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=64, seq_len=64, layers=1, d_model=32, heads=2))
    dev = copy.deepcopy(model).to("pjrt")
    fn = torch.compile(dev, backend="pjrt")
    wide = _float64(model)
    for b, t in sizes:
        x, y = torch.randint(0, 64, (b, t)), torch.randint(0, 64, (b, t))
        with torch.set_grad_enabled(train):
            logits, loss = model(x, y)
            logits_w, loss_w = wide(x, y)
            logits_d, loss_d = fn(_dynamic(x, dim), _dynamic(y, dim))
        assert_as_accurate_as_cpu([logits_d, loss_d], [logits, loss], [logits_w, loss_w])
        if train:
            for t in (loss, loss_w, loss_d):
                t.backward()
            assert_as_accurate_as_cpu(*([p.grad for p in m.parameters()]
                                        for m in (dev, model, wide)))
    assert torch_pjrt.metrics().get("bucket_fallback_graphs", 0) == 0


def test_gpt_training_dynamic_batch():
    _gpt_step([(3, 16), (5, 16), (7, 16), (8, 16)], dim=0)
    assert _programs() == 4  # buckets 4 and 8, forward and backward each


def test_gpt_training_dynamic_sequence():
    _gpt_step([(3, 17), (3, 30), (3, 64)], dim=1)
    assert _programs() == 6  # buckets 20, 32, 64, forward and backward each


def test_gpt_inference_dynamic_sequence_within_a_bucket():
    _gpt_step([(2, 25), (2, 27), (2, 28)], dim=1, train=False)
    assert _programs() == 1  # all in bucket 28


def test_unclassified_op_falls_back_to_one_program_per_shape():
    def f(x):
        return torch.cat([x, x.flip(0)], dim=0).cumsum(0) * 2

    fn = torch.compile(f, backend="pjrt")
    with pytest.warns(UserWarning, match="padding to buckets does not handle"):
        for n in (3, 5, 6):
            x = torch.randn(n, 4)
            assert_as_accurate_as_cpu(fn(_dynamic(x, 0)), f(x), f(x.double()))
    m = torch_pjrt.metrics()
    assert m["bucket_fallback_graphs"] >= 1 and _programs() == 0


def test_buckets_off_compiles_per_shape(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_BUCKETS", "0")
    model = _mlp()
    fn = torch.compile(copy.deepcopy(model).to("pjrt"), backend="pjrt")
    wide = _float64(model)
    with torch.no_grad():
        for b in (5, 6, 7):
            x = torch.randn(b, 8)
            assert_as_accurate_as_cpu(fn(_dynamic(x, 0)), model(x), wide(x.double()))
    assert _programs() == 0
    # three shapes, three programs (eager code between the calls may recompile too)
    assert torch_pjrt.metrics()["recompiles.compiled"] == 2


def test_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_BUCKETS", "3")
    with pytest.raises(ValueError, match="TORCH_PJRT_BUCKETS"):
        buckets.steps_per_octave()


def test_recompile_warning_counts_buckets():
    fn = torch.compile(lambda x: (x * 2).sum(), backend="pjrt", dynamic=True)
    sizes = (17, 18, 19, 20, 21, 22, 23, 24)  # two buckets: no warning
    for n in sizes:
        fn(torch.randn(n, device="pjrt"))
    assert _programs() == 2
    with pytest.warns(UserWarning, match=r"padded to buckets\) has been compiled for 9.*bucket"):
        for n in (30, 40, 48, 56, 64, 80, 96, 112):  # eight more buckets
            fn(torch.randn(n, device="pjrt"))
