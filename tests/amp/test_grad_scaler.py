"""torch.amp.GradScaler("pjrt") with float16 autocast behaves as on CUDA: gradients
unscaled, a step with an inf/NaN gradient skipped, the scale backed off and grown on
CUDA's schedule, and one 4-byte read of found_inf per step as CUDA's own .item() (none
with a fused optimizer); its two fused ops are lowered (no CPU fallback)."""

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_as_accurate

import torch_pjrt

STEPS = 6
OVERFLOW_STEP = 3  # an inf input there makes every gradient inf or NaN
GROWTH_INTERVAL = 2

OPTIMIZERS = {
    "sgd_foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw_for_loop": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(device, make_opt, *, compiled=False, clip=False, reference=False):
    """STEPS fp16-autocast steps; per step: the scale after update(), whether the
    parameters moved, the optimizer's step count, the host reads and flushes. `reference`:
    the same steps in float64 without autocast, on the CPU, which the fp16 runs are
    measured against (tests/tolerance.py)."""
    dtype = torch.float64 if reference else torch.float32
    model = _model().to(device, dtype)
    opt = make_opt(model.parameters())
    forward = torch.compile(model, backend="pjrt") if compiled else model
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, growth_interval=GROWTH_INTERVAL)
    torch.manual_seed(1)
    history = []
    for step in range(STEPS):
        x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
        if step == OVERFLOW_STEP:
            x[0, 0] = float("inf")
        x, y = x.to(device, dtype), y.to(device)
        before = [p.detach().cpu().clone() for p in model.parameters()]
        torch_pjrt.counters.reset()
        with torch.autocast(device, dtype=torch.float16, enabled=not reference):
            loss = F.cross_entropy(forward(x), y)
        assert loss.dtype == dtype
        opt.zero_grad()
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        metrics = torch_pjrt.metrics()
        after = [p.detach().cpu() for p in model.parameters()]
        moved = any(not torch.equal(b, a) for b, a in zip(before, after))
        steps = [s["step"].item() for s in opt.state.values() if "step" in s]
        history.append({"scale": scaler.get_scale(), "moved": moved, "steps": steps[:1],
                        "reads": metrics.get("device_to_host_bytes", 0),
                        "read_flushes": metrics.get("flushes.data read", 0),
                        "fallbacks": metrics["cpu_fallbacks"]})
    return history, [p.detach().cpu() for p in model.parameters()]


def _as_accurate(params, cpu_params, make_opt, **kw):
    """Parameters after the fp16 steps as accurate as the CPU's against the float64 run."""
    _, wide = _train("cpu", make_opt, reference=True, **kw)
    for i, (p, e, r) in enumerate(zip(params, cpu_params, wide)):
        assert_as_accurate(p, e, r, what=f"parameter {i}")


def _same_schedule(history, cpu_history):
    for got, want in zip(history, cpu_history):
        assert (got["scale"], got["moved"], got["steps"]) == \
            (want["scale"], want["moved"], want["steps"])
        assert not got["fallbacks"]  # the amp ops and every other op are lowered


def _expected_scales():
    """CUDA's schedule: x2 after GROWTH_INTERVAL clean steps, x0.5 (and no step) at an inf."""
    scale, clean, out = 2.0 ** 16, 0, []
    for step in range(STEPS):
        if step == OVERFLOW_STEP:
            scale, clean = scale * 0.5, 0
        else:
            clean += 1
            if clean == GROWTH_INTERVAL:
                scale, clean = scale * 2, 0
        out.append(scale)
    return out


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_training_matches_cpu(opt):
    history, params = _train("pjrt", OPTIMIZERS[opt])
    cpu_history, cpu_params = _train("cpu", OPTIMIZERS[opt])
    _same_schedule(history, cpu_history)
    assert [h["scale"] for h in history] == _expected_scales()
    assert [h["moved"] for h in history] == [step != OVERFLOW_STEP for step in range(STEPS)]
    _as_accurate(params, cpu_params, OPTIMIZERS[opt])


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_host_reads_per_step(opt):
    """CUDA's GradScaler reads found_inf once per step (`.item()` before optimizer.step)
    unless the optimizer takes the scale itself (fused): pjrt reads exactly that, and in
    fused eager that read is the step's only flush beyond the backward pass's and the
    optimizer step's own."""
    with torch_pjrt.set_eager_mode("fused"):
        history, _ = _train("pjrt", OPTIMIZERS[opt])
    fused = opt == "adam_fused"
    assert [h["reads"] for h in history] == [0 if fused else 4] * STEPS
    assert [h["read_flushes"] for h in history] == [0 if fused else 1] * STEPS


@pytest.mark.usefixtures("eager_mode")
def test_unscale_and_clip():
    history, params = _train("pjrt", OPTIMIZERS["sgd_foreach"], clip=True)
    cpu_history, cpu_params = _train("cpu", OPTIMIZERS["sgd_foreach"], clip=True)
    _same_schedule(history, cpu_history)
    _as_accurate(params, cpu_params, OPTIMIZERS["sgd_foreach"], clip=True)


def test_compiled_model():
    torch._dynamo.reset()
    history, params = _train("pjrt", OPTIMIZERS["adam_fused"], compiled=True)
    cpu_history, cpu_params = _train("cpu", OPTIMIZERS["adam_fused"])
    _same_schedule(history, cpu_history)
    _as_accurate(params, cpu_params, OPTIMIZERS["adam_fused"])


# --------------------------------------------------------- the two fused ops, directly
@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("found_before", [0.0, 1.0])
def test_non_finite_check_and_unscale(bad, found_before):
    def run(device):
        torch.manual_seed(0)
        grads = [torch.randn(5) * 1e3, torch.randn(2, 3).half() * 1e3,
                 torch.randn(4).bfloat16()]
        if bad is not None:
            grads[1][1, 2] = bad
        grads = [g.to(device) for g in grads]
        found = torch.full((), found_before).to(device)
        inv = torch.full((), 1 / 1024.0).to(device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        return [g.cpu() for g in grads], found.cpu()

    (grads, found), (cpu_grads, cpu_found) = run("pjrt"), run("cpu")
    assert found.item() == cpu_found.item() == (1.0 if bad is not None else found_before)
    for g, e in zip(grads, cpu_grads):
        torch.testing.assert_close(g, e, equal_nan=True)
    assert not torch_pjrt.metrics()["cpu_fallbacks"]


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("scale,tracker,found", [
    (1024.0, 0, 0.0), (1024.0, 2, 0.0),  # count a clean step; grow on the interval
    (1024.0, 2, 1.0),  # back off and reset the count
    (3e38, 2, 0.0),  # growing would overflow: the scale stays
])
def test_update_scale(scale, tracker, found):
    def run(device):
        s = torch.full((), scale).to(device)
        t = torch.full((), tracker, dtype=torch.int32).to(device)
        torch._amp_update_scale_(s, t, torch.full((), found).to(device), 2.0, 0.5, 3)
        return s.item(), t.item()

    assert run("pjrt") == run("cpu")
    assert not torch_pjrt.metrics()["cpu_fallbacks"]
