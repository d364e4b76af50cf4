"""Compiled CNN (convolution + BatchNorm + pooling): training and eval match CPU, running
statistics included, and the compiled step runs every graph on the device."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tolerance import adamw_step_sensitivity, assert_as_accurate

import torch_pjrt


def _cnn() -> nn.Module:
    # No conv bias before a BatchNorm: its gradient is zero up to rounding, which AdamW
    # would scale up to a full step in a direction that differs from run to run.
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
                                        (torch.optim.AdamW, {"lr": 1e-2})])
def test_cnn_training_then_eval_matches_cpu(opt_cls, kw):
    torch.manual_seed(0)
    model = _cnn()
    dev = copy.deepcopy(model).to("pjrt")
    compiled = torch.compile(dev, backend="pjrt")
    wide = copy.deepcopy(model).double()  # the reference (tests/tolerance.py)
    o_cpu, o_dev = opt_cls(model.parameters(), **kw), opt_cls(dev.parameters(), **kw)
    o_wide = opt_cls(wide.parameters(), **kw)
    amplified = {}
    for _ in range(3):
        x, y = torch.randn(6, 3, 12, 12), torch.randint(0, 10, (6,))
        for m, o, d, t in ((model, o_cpu, "cpu", torch.float32),
                           (compiled, o_dev, "pjrt", torch.float32),
                           (wide, o_wide, "cpu", torch.float64)):
            o.zero_grad()
            loss = F.cross_entropy(m(x.to(d, t)), y.to(d))
            loss.backward()
            o.step()
        if opt_cls is torch.optim.AdamW:
            for p, a in adamw_step_sensitivity(o_cpu).items():
                amplified[p] = amplified.get(p, 0) + a
    by_name = {n: amplified.get(p) for n, p in model.named_parameters()}
    for (name, p), q, r in zip(model.state_dict().items(), dev.state_dict().values(),
                               wide.state_dict().values()):
        # parameters and BatchNorm's running mean/var/num_batches_tracked
        assert_as_accurate(q.cpu(), p, r.to(p.dtype) if not p.is_floating_point() else r,
                           sensitivity=by_name.get(name), what=name)
    model.eval()
    dev.eval()
    wide.eval()
    x = torch.randn(4, 3, 12, 12)
    with torch.no_grad():
        assert_as_accurate(compiled(x.to("pjrt")).cpu(), model(x), wide(x.double()))
    m = torch_pjrt.metrics()
    assert m.get("compile_eager_graphs", 0) == 0 and m["cpu_fallbacks"] == {}
