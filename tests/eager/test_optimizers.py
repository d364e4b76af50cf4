"""Every torch.optim optimizer trains a small model on pjrt as it does on the CPU."""

import copy

import pytest
import torch
from helpers import assert_as_accurate_as_cpu
from tolerance import SIDES, adamw_step_sensitivity, assert_as_accurate, rounding

import torch_pjrt

STEPS = 5

# (optimizer, constructor kwargs): the variants torch.optim's foreach/fused paths branch on.
CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "dampening": 0.0}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "maximize": True}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "maximize": True}),
    ("Adam", {"lr": 0.01, "capturable": True}),
    ("Adam", {"lr": 0.01, "capturable": True, "amsgrad": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "amsgrad": True, "maximize": True}),
    ("AdamW", {"lr": 0.01, "capturable": True}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "capturable": True, "momentum": 0.5}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {"lr": 1.0}),
    ("Adadelta", {"lr": 1.0, "weight_decay": 0.1, "capturable": True}),
    ("Adamax", {"lr": 0.01}),
    ("Adamax", {"lr": 0.01, "weight_decay": 0.1, "capturable": True}),
    ("NAdam", {"lr": 0.01}),
    ("NAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "capturable": True}),
    ("RAdam", {"lr": 0.01}),
    ("RAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "capturable": True}),
    ("ASGD", {"lr": 0.01}),
    ("ASGD", {"lr": 0.01, "weight_decay": 0.1, "capturable": True}),
    ("Rprop", {"lr": 0.01}),
    ("Rprop", {"lr": 0.01, "maximize": True, "capturable": True}),
]
FUSED = {"SGD", "Adam", "AdamW", "Adagrad"}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(model, opt_cls, kwargs, device, dtype=torch.float32):
    """The trained parameters, and the optimizer; `opt.sensitivity`: per parameter, how much
    Adam-like steps (lr / sqrt(v)) amplified its gradients' rounding (tests/tolerance.py)."""
    model = copy.deepcopy(model).to(device, dtype)
    opt = opt_cls(model.parameters(), **kwargs)
    params = list(model.parameters())
    opt.sensitivity = [None] * len(params)
    torch.manual_seed(1)
    for _ in range(STEPS):
        x, y = torch.randn(6, 4).to(device, dtype), torch.randn(6, 3).to(device, dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if "exp_avg_sq" in opt.state[params[0]]:
            found = adamw_step_sensitivity(opt)
            opt.sensitivity = [found[p] + (0 if s is None else s)
                               for p, s in zip(params, opt.sensitivity)]
    return [p.detach() for p in params], opt


def _capturable_error(kwargs) -> float:
    """What a capturable optimizer adds to each parameter's error: its bias corrections
    (1 - beta ** step) are float32 tensors, not the CPU's Python floats, and at step 1
    1 - 0.999 keeps only rounding(float32) / 0.001 of its relative accuracy; the square
    root halves it, and every step's update (at most lr) carries it."""
    if not kwargs.get("capturable"):
        return 0.0
    return STEPS * kwargs["lr"] * SIDES * rounding(torch.float32) / (1 - 0.999) / 2


def _cpu_kwargs(kwargs):
    return {k: v for k, v in kwargs.items() if k not in ("capturable", "fused", "foreach")}


def _check(name, kwargs, mode):
    opt_cls = getattr(torch.optim, name)
    model = _model()
    cpu_kwargs = {**_cpu_kwargs(kwargs), "foreach": False}
    expected, cpu_opt = _train(model, opt_cls, cpu_kwargs, "cpu")
    reference, _ = _train(model, opt_cls, cpu_kwargs, "cpu", torch.float64)
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    actual, opt = _train(model, opt_cls, {**kwargs, **mode}, "pjrt")
    for i, (a, e, r, amplified) in enumerate(zip(actual, expected, reference,
                                                 cpu_opt.sensitivity)):
        assert a.device.type == "pjrt"
        assert_as_accurate(a.cpu(), e, r, sensitivity=amplified, atol=_capturable_error(kwargs),
                           what=f"parameter {i}")
    new = {k: v for k, v in torch_pjrt.metrics()["cpu_fallbacks"].items() if before.get(k) != v}
    assert not new, f"{name} fell back to the CPU for {new}"


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in
                                                     enumerate(CASES)])
@pytest.mark.parametrize("foreach", [True, False])
def test_optimizer_matches_cpu(name, kwargs, foreach):
    _check(name, kwargs, {"foreach": foreach})


@pytest.mark.parametrize("name,kwargs", [c for c in CASES if c[0] in FUSED
                                         and not c[1].get("capturable")],
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_fused_optimizer_matches_cpu(name, kwargs):
    _check(name, kwargs, {"fused": True})


def test_clip_grad_norm_foreach():
    model = _model()
    grads = [torch.randn_like(p) * 10 for p in model.parameters()]
    results = []
    for device, dtype in (("cpu", torch.float32), ("pjrt", torch.float32),
                          ("cpu", torch.float64)):
        m = copy.deepcopy(model).to(device, dtype)
        for p, g in zip(m.parameters(), grads):
            p.grad = g.clone().to(device, dtype)
        norms = [torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, norm_type=t, foreach=True)
                 for t in (2.0, float("inf"), 1.0)]
        results.append(norms + [p.grad for p in m.parameters()])
    assert_as_accurate_as_cpu(results[1], results[0], results[2])


def test_optimizer_with_mixed_dtype_params():
    params = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64), torch.randn(2, 2)]
    grads = [torch.randn_like(p) for p in params]
    out = []
    for device, wide in (("cpu", False), ("pjrt", False), ("cpu", True)):
        ps = [(p.double() if wide else p).clone().to(device).requires_grad_() for p in params]
        opt = torch.optim.AdamW(ps, lr=0.01, foreach=device == "pjrt")
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.to(device, p.dtype)
            opt.step()
        out.append([p.detach() for p in ps])
    assert_as_accurate_as_cpu(out[1], out[0], out[2])


@pytest.mark.parametrize("name,kwargs,mode", [
    ("Adam", {"lr": 0.01, "amsgrad": True}, {"foreach": True}),
    ("AdamW", {"lr": 0.01}, {"fused": True}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, {"foreach": True}),
    ("Adagrad", {"lr": 0.1}, {"fused": True}),
], ids=["adam-foreach", "adamw-fused", "sgd-foreach", "adagrad-fused"])
def test_optimizers_in_every_eager_mode(eager_mode, name, kwargs, mode):
    _check(name, kwargs, mode)


@pytest.mark.parametrize("mode", [{"foreach": True}, {"fused": True}, {"foreach": False}],
                         ids=["foreach", "fused", "for-loop"])
@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_grad_scaler(name, mode):
    """torch.amp.GradScaler: unscale (and skip the step after an inf), grow and back off."""

    def run(device, opt_mode, dtype=torch.float32):
        model = _model().to(device, dtype)
        kwargs = {"lr": 0.01} if name == "Adam" else {"lr": 0.1, "momentum": 0.9}
        opt = getattr(torch.optim, name)(model.parameters(), **kwargs, **opt_mode)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        torch.manual_seed(1)
        for i in range(6):
            x = torch.randn(6, 4, dtype=dtype)
            if i == 2:
                x[0, 0] = float("inf")
            opt.zero_grad()
            scaler.scale(model(x.to(device)).sum()).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in model.parameters()], scaler.get_scale()

    expected = run("cpu", {"foreach": False})
    reference = run("cpu", {"foreach": False}, torch.float64)
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    params, scale = run("pjrt", mode)
    assert_as_accurate_as_cpu(params, expected[0], reference[0])
    assert scale == expected[1]
    assert torch_pjrt.metrics()["cpu_fallbacks"] == before


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_with_tensor_lr(name):
    kwargs = {"lr": torch.tensor(0.05)}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    opt_cls = getattr(torch.optim, name)
    model = _model()
    cpu_kwargs = {"lr": 0.05, **{k: v for k, v in kwargs.items() if k != "lr"},
                  "foreach": False}
    expected, _ = _train(model, opt_cls, cpu_kwargs, "cpu")
    reference, _ = _train(model, opt_cls, cpu_kwargs, "cpu", torch.float64)
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    actual, _ = _train(model, opt_cls, {**kwargs, "fused": True}, "pjrt")
    assert_as_accurate_as_cpu(actual, expected, reference)
    assert torch_pjrt.metrics()["cpu_fallbacks"] == before
