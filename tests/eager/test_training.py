"""Autograd and training on pjrt match CPU PyTorch step by step."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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


def _train(model, device, steps, opt_cls, data, **opt_kw):
    model = model.to(device)
    opt = opt_cls(model.parameters(), **opt_kw)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.AdamW, {"lr": 3e-3}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 3e-3, "foreach": False}),
])
def test_gpt_training_matches_cpu(opt_cls, kw):
    torch.manual_seed(0)
    model = TinyGPT()
    data = [(torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16))) for _ in range(4)]
    cpu_losses, cpu_model = _train(copy.deepcopy(model), "cpu", 4, opt_cls, data, **kw)
    dev_losses, dev_model = _train(copy.deepcopy(model), "pjrt", 4, opt_cls, data, **kw)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-4)
    # Adam turns float noise in exactly-zero gradients (the attention key bias) into
    # steps of size lr on either device, so its parameters agree only to ~lr/10.
    atol = 1e-3 if opt_cls is not torch.optim.SGD else 2e-5
    for (name, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.cpu(), p, atol=atol, rtol=1e-3, msg=name)


def test_gpt_gradients_match_cpu():
    torch.manual_seed(0)
    model = TinyGPT()
    dev_model = copy.deepcopy(model).to("pjrt")
    x, y = torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16))
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    F.cross_entropy(dev_model(x.to("pjrt")).flatten(0, 1), y.to("pjrt").flatten()).backward()
    for (name, p), q in zip(model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_gradients_of_views_and_in_place():
    x = torch.randn(4, 5, requires_grad=True)
    d = x.detach().to("pjrt").requires_grad_()
    for t in (x, d):
        y = t * 2
        y[:, 1:3].mul_(t[:, :2].sigmoid())
        y.t().sum(0).pow(2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)
