"""torch.compile(backend="pjrt") on graphs that mix CPU and pjrt tensors, or hold no pjrt
tensor at all: every output on the device PyTorch gives it, values as eager."""

import warnings

import pytest
import torch

P = torch.device("pjrt", 0)


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == w.device, (g.device, w.device)
        torch.testing.assert_close(g.cpu(), w.cpu())


CASES = {
    "moved to the cpu inside": (lambda x: (x.cpu() * 2, x + 1),
                                lambda: (torch.ones(3, device=P),)),
    "cpu input moved to the device": (lambda x, y: x * 2 + y.to("pjrt"),
                                      lambda: (torch.ones(3, device=P), torch.arange(3.))),
    "cpu outputs only": (lambda x, y: (x.cpu() + y, y * 2),
                         lambda: (torch.ones(3, device=P), torch.arange(3.))),
    "only cpu inputs": (lambda x: ((x.to("pjrt") * 3).sum(), x + 1),
                        lambda: (torch.arange(4.).reshape(2, 2).t(),)),
    "cpu scalar tensor": (lambda x, s: x.to("pjrt") * s,
                          lambda: (torch.ones(3), torch.tensor(2.5))),
}


@pytest.mark.parametrize("name", CASES)
def test_outputs_on_the_devices_eager_gives(name):
    fn, make = CASES[name]
    args = make()
    _same(torch.compile(fn, backend="pjrt")(*args), fn(*args))


def test_training_step_moving_a_cpu_batch():
    def grads(compiled):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2).to(P)
        x = torch.randn(4, 3, requires_grad=True)

        def step(xb):
            return model(xb.to("pjrt")).pow(2).sum()

        loss = (torch.compile(step, backend="pjrt") if compiled else step)(x)
        loss.backward()
        return loss, model.weight.grad, x.grad

    got, want = grads(True), grads(False)
    assert got[2].device.type == "cpu"
    _same(got, want)


def test_a_graph_without_pjrt_tensors_runs_as_it_is_with_a_warning():
    from torch_pjrt.compile import backend

    backend._warned.discard(backend._CPU_GRAPH)
    x = torch.arange(5.)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torch.compile(lambda t: torch.cos(t) + 1, backend="pjrt")(x)
    _same(got, torch.cos(x) + 1)
    assert any("no pjrt tensor" in str(w.message) for w in seen)
