"""Autograd and training on pjrt match CPU PyTorch step by step."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu
from tolerance import adamw_step_sensitivity, assert_as_accurate

pytestmark = pytest.mark.usefixtures("eager_mode")


class TinyGPT(nn.Module):
    def __init__(self, vocab=32, d=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.ln(x))


def _train(model, device, steps, opt_cls, data, dtype=torch.float32, **opt_kw):
    """Losses, the trained model, and per parameter how much Adam's steps amplified its
    gradients' rounding (tests/tolerance.py; 1 for SGD)."""
    model = model.to(device, dtype)
    opt = opt_cls(model.parameters(), **opt_kw)
    losses, sensitivity = [], [torch.zeros(()) for _ in model.parameters()]
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if "exp_avg_sq" in opt.state[next(model.parameters())]:
            found = adamw_step_sensitivity(opt)
            sensitivity = [s + found[p] for s, p in zip(sensitivity, model.parameters())]
    if opt_cls is torch.optim.SGD:
        sensitivity = [None for _ in sensitivity]
    return torch.stack(losses), model, sensitivity


@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.AdamW, {"lr": 3e-3}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 3e-3, "foreach": False}),
])
def test_gpt_training_matches_cpu(opt_cls, kw):
    torch.manual_seed(0)
    model = TinyGPT()
    data = [(torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16))) for _ in range(4)]
    cpu_losses, cpu_model, sensitivity = _train(copy.deepcopy(model), "cpu", 4, opt_cls,
                                                data, **kw)
    dev_losses, dev_model, _ = _train(copy.deepcopy(model), "pjrt", 4, opt_cls, data, **kw)
    wide_losses, wide_model, _ = _train(copy.deepcopy(model), "cpu", 4, opt_cls, data,
                                        torch.float64, **kw)
    assert_as_accurate_as_cpu(dev_losses, cpu_losses, wide_losses)
    # Adam turns float noise in exactly-zero gradients (the attention key bias) into
    # steps of size lr on either device: each parameter's bound follows its amplification
    for (name, p), q, r, amplified in zip(cpu_model.named_parameters(), dev_model.parameters(),
                                          wide_model.parameters(), sensitivity):
        assert_as_accurate(q.detach().cpu(), p.detach(), r.detach(), sensitivity=amplified,
                           what=name)


def test_gpt_gradients_match_cpu():
    torch.manual_seed(0)
    model = TinyGPT()
    dev_model = copy.deepcopy(model).to("pjrt")
    wide = copy.deepcopy(model).double()
    x, y = torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16))
    for m in (model, dev_model, wide):
        device = next(m.parameters()).device
        F.cross_entropy(m(x.to(device)).flatten(0, 1), y.to(device).flatten()).backward()
    assert_as_accurate_as_cpu(*([p.grad for p in m.parameters()]
                                for m in (dev_model, model, wide)))


def test_gradients_of_views_and_in_place():
    x = torch.randn(4, 5, requires_grad=True)
    d = x.detach().to("pjrt").requires_grad_()
    for t in (x, d):
        y = t * 2
        y[:, 1:3].mul_(t[:, :2].sigmoid())
        y.t().sum(0).pow(2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)
