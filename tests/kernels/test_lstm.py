"""nn.LSTM on pjrt as one scanned operator (kernels/lstm.py), against CPU PyTorch: outputs,
final states and every gradient, in each eager mode and compiled; the calls it does not
cover run PyTorch's per-step composite and match too."""

import copy

import pytest
import torch
from tolerance import SIDES, assert_as_accurate, rounding

import torch_pjrt.kernels.lstm as lstm_kernel

pytestmark = pytest.mark.usefixtures("eager_mode")


def _run(module, x, state, device):
    module = module.to(device)
    x = x.detach().to(device).requires_grad_()
    out, (h, c) = module(x, tuple(s.to(device) for s in state)) if state else module(x)
    (out.sum() * 1.3 + h.pow(2).sum() + c.sum()).backward()
    return [out, h, c, x.grad] + [p.grad for p in module.parameters()]


def _compare(make, x, state=None):
    """Outputs, states and gradients as accurate as the CPU's against the same LSTM in
    float64 (tests/tolerance.py): a recurrence compounds each step's rounding."""
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    wide = copy.deepcopy(cpu).double()
    want = _run(cpu, x, state, "cpu")
    got = _run(dev, x, state, "pjrt")
    reference = _run(wide, x.double(), tuple(s.double() for s in state) if state else None, "cpu")
    for i, (g, w, r) in enumerate(zip(got, want, reference)):
        assert_as_accurate(g.cpu(), w, r, what=f"result {i}")


@pytest.fixture
def calls(monkeypatch):
    """How many calls reached the scanned operator."""
    seen = []
    scanned = lstm_kernel.scanned

    def counted(*args):
        seen.append(1)
        return scanned(*args)

    monkeypatch.setattr(lstm_kernel, "scanned", counted)
    return seen


@pytest.mark.parametrize("layers,bidirectional,batch_first,bias", [
    (1, False, False, True), (2, False, True, True), (2, True, False, True),
    (1, True, True, False)], ids=["1-layer", "2-layer-batch-first", "bidirectional",
                                  "bidirectional-no-bias"])
def test_scanned_lstm_matches_cpu(layers, bidirectional, batch_first, bias, calls):
    x = torch.randn(3, 7, 5) if batch_first else torch.randn(7, 3, 5)
    n = layers * (2 if bidirectional else 1)
    state = (torch.randn(n, 3, 6), torch.randn(n, 3, 6))
    _compare(lambda: torch.nn.LSTM(5, 6, layers, bias=bias, batch_first=batch_first,
                                   bidirectional=bidirectional), x, state)
    _compare(lambda: torch.nn.LSTM(5, 6, layers, bias=bias, batch_first=batch_first,
                                   bidirectional=bidirectional), x)  # zero initial state
    assert len(calls) == 2


def test_bfloat16_gates_compute_in_float32(calls):
    _compare(lambda: torch.nn.LSTM(5, 6, 2).to(torch.bfloat16),
             torch.randn(7, 3, 5, dtype=torch.bfloat16))
    assert len(calls) == 1


def test_projections_run_the_composite(calls):
    _compare(lambda: torch.nn.LSTM(5, 6, 2, proj_size=3), torch.randn(7, 3, 5))
    assert not calls


def test_unbatched_input(calls):
    _compare(lambda: torch.nn.LSTM(5, 6, 1), torch.randn(7, 5))
    assert len(calls) == 1  # nn.LSTM adds the batch dimension itself


def test_dropout_between_layers_while_training_runs_the_composite(calls):
    m = torch.nn.LSTM(5, 6, 2, dropout=0.5).to("pjrt")
    out, _ = m(torch.randn(7, 3, 5, device="pjrt"))
    out.sum().backward()
    assert not calls
    m.eval()  # no dropout when evaluating: scanned
    m(torch.randn(7, 3, 5, device="pjrt"))
    assert len(calls) == 1


def test_compiled_model_with_an_lstm_matches_cpu():
    def make():
        return torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Tanh())

    torch.manual_seed(0)
    head, rnn = make(), torch.nn.LSTM(5, 6, 2, batch_first=True)

    def step(device):
        h, r = head.to(device), rnn.to(device)
        fn = torch.compile(lambda x: r(h(x))[0].sum(), backend="pjrt") \
            if device == "pjrt" else (lambda x: r(h(x))[0].sum())
        for p in (*h.parameters(), *r.parameters()):
            p.grad = None
        dtype = next(r.parameters()).dtype
        loss = fn(torch.linspace(-1, 1, 3 * 4 * 5).reshape(3, 4, 5).to(device, dtype))
        loss.backward()
        return [loss] + [p.grad.clone() for p in (*h.parameters(), *r.parameters())]

    want = step("cpu")
    got = step("pjrt")
    head.double()
    rnn.double()
    reference = step("cpu")
    # the loss sums 72 LSTM outputs, each in (-1, 1): sum_bound's for that sum
    terms = 3 * 4 * 6
    assert_as_accurate(got[0].cpu(), want[0], reference[0],
                       atol=SIDES * terms * rounding(torch.float32) * terms)
    for g, w, r in zip(got[1:], want[1:], reference[1:]):
        assert_as_accurate(g.cpu(), w, r)


def test_without_gradients_the_inference_op_runs(monkeypatch):
    """Under no_grad the op that saves nothing runs; with gradients the training op runs
    once and the backward reads what it saved (the forward is not computed again)."""
    ran = []
    for name in ("lstm", "lstm_train", "lstm_backward"):
        op = getattr(lstm_kernel, name)
        monkeypatch.setattr(lstm_kernel, name,
                            lambda *a, _op=op, _name=name: ran.append(_name) or _op(*a))
    torch.manual_seed(0)
    cpu = torch.nn.LSTM(5, 6, 2, bidirectional=True)
    dev = torch.nn.LSTM(5, 6, 2, bidirectional=True).to("pjrt")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(7, 3, 5)
    with torch.no_grad():
        got, want = dev(x.to("pjrt"))[0], cpu(x)[0]
        reference = copy.deepcopy(cpu).double()(x.double())[0]
    assert_as_accurate(got.cpu(), want, reference)
    assert ran == ["lstm"]
    ran.clear()
    dev(x.to("pjrt"))[0].sum().backward()
    assert ran == ["lstm_train", "lstm_backward"]


@pytest.mark.parametrize("bidirectional", [False, True])
def test_double_backward_matches_cpu(bidirectional, calls):
    # lstm_backward's scans have no derivative: under create_graph the gradients came back
    # as constants and a second backward (gradgradcheck, a gradient penalty) gave zeros
    torch.manual_seed(0)
    make = lambda: torch.nn.LSTM(4, 3, 2, bidirectional=bidirectional).double()  # noqa: E731
    cpu = make()
    x = torch.randn(5, 2, 4, dtype=torch.double)
    results = []
    for device in ("cpu", "pjrt"):
        module = copy.deepcopy(cpu).to(device)
        xd = x.to(device).requires_grad_()
        out, (h, c) = module(xd)
        loss = (out * out).sum() + h.sum() + c.pow(2).sum()
        params = list(module.parameters())
        grads = torch.autograd.grad(loss, [xd, *params], create_graph=True)
        penalty = sum(g.pow(2).sum() for g in grads)
        second = torch.autograd.grad(penalty, [xd, *params])
        results.append([t.detach().cpu() for t in (*grads, *second)])
    for got, want in zip(results[1], results[0]):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert len(calls) == 1
