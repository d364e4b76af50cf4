"""Replayed graphs (eager/replay.py): a step recorded once runs again on new arguments with
the CPU's results and state, records nothing, and refuses what it cannot replay."""

import pytest
import torch

import torch_pjrt
from torch_pjrt.eager import replay


class Step:
    """A serving step in miniature: a weight (state read), a cache written in place at
    the argument's slots (state written), a result computed from both."""

    def __init__(self, device: str):
        torch.manual_seed(0)
        self.weight = torch.randn(8, 8).to(device)
        self.cache = torch.zeros(16, 8, device=device)

    def __call__(self, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.weight) * 0.5
        self.cache.index_copy_(0, slots, h)
        return self.cache.sum(0, keepdim=True) + h.mean()


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(2, 8, generator=g), torch.tensor([2 * i, 2 * i + 1])


@pytest.fixture
def fused():
    with torch_pjrt.set_eager_mode("fused"):
        yield


def test_replay_equals_cpu_and_records_nothing(fused):
    cpu, dev = Step("cpu"), Step("pjrt")
    x, s = (t.to("pjrt") for t in _inputs(0))
    out, first, why = replay.capture(lambda: dev(x, s), [x, s])
    assert why is None and first is not None
    torch.testing.assert_close(out.cpu(), cpu(*_inputs(0)))
    x, s = (t.to("pjrt") for t in _inputs(1))
    out, second, _ = replay.capture(lambda: dev(x, s), [x, s])
    assert first.same_as(second)
    torch.testing.assert_close(out.cpu(), cpu(*_inputs(1)))
    before = torch_pjrt.metrics()
    for i in range(2, 6):
        x, s = (t.to("pjrt") for t in _inputs(i))
        (out,) = second([x, s])
        want = cpu(*_inputs(i))
        assert out.device.type == "pjrt" and out.shape == want.shape
        torch.testing.assert_close(out.cpu(), want)
        torch.testing.assert_close(dev.cache.cpu(), cpu.cache)  # the state written
    after = torch_pjrt.metrics()
    assert after.get("graph_replays", 0) - before.get("graph_replays", 0) == 4
    # nothing recorded: the only flushes are the reads of the results above
    assert after.get("graph_ops", 0) == before.get("graph_ops", 0)
    assert after.get("compiles", 0) == before.get("compiles", 0)


def test_other_python_numbers_are_not_the_same_graph(fused):
    dev = Step("pjrt")
    x, s = (t.to("pjrt") for t in _inputs(0))
    _, a, _ = replay.capture(lambda: dev(x, s) * 2.0, [x, s])
    _, b, _ = replay.capture(lambda: dev(x, s) * 3.0, [x, s])
    _, c, _ = replay.capture(lambda: dev(x, s) * 3.0, [x, s])
    assert not a.same_as(b)
    assert b.same_as(c)


def test_arguments_of_another_signature_are_refused(fused):
    dev = Step("pjrt")
    x, s = (t.to("pjrt") for t in _inputs(0))
    _, rep, _ = replay.capture(lambda: dev(x, s), [x, s])
    wide = torch.randn(4, 8).to("pjrt")
    with pytest.raises(ValueError, match="differ from the capture"):
        rep([wide, torch.tensor([0, 1, 2, 3]).to("pjrt")])
    # the same sizes, but a view at another offset of a bigger storage
    big = torch.randn(3, 8).to("pjrt")
    with pytest.raises(ValueError, match="differ from the capture"):
        rep([big[1:], s])


def test_a_freed_state_is_an_error(fused):
    dev = Step("pjrt")
    x, s = (t.to("pjrt") for t in _inputs(0))
    _, rep, _ = replay.capture(lambda: dev(x, s), [x, s])
    dev.cache = torch.zeros(16, 8, device="pjrt")  # the captured cache is freed
    with pytest.raises(RuntimeError, match="freed or replaced"):
        rep([x, s])


def test_what_cannot_be_replayed_is_refused_with_a_reason(fused):
    x = torch.randn(4).to("pjrt")
    kept = []

    def keeps_a_tensor():
        kept.append(x * 2)
        return x + 1

    _, rep, why = replay.capture(keeps_a_tensor, [x])
    assert rep is None and "keeps a new tensor alive" in why

    def reads_a_value():
        y = x * 2
        y.sum().item()
        return y + 1

    out, rep, why = replay.capture(reads_a_value, [x])
    assert rep is None and "before its end" in why
    torch.testing.assert_close(out.cpu(), x.cpu() * 2 + 1)

    _, rep, why = replay.capture(lambda: x[1:] * 1, [x])
    assert rep is not None  # a view of an argument is read, a new tensor returned

    _, rep, why = replay.capture(lambda: (x * 2)[1:], [x])
    assert rep is None and "view" in why


def test_strict_mode_runs_the_function_without_a_replay():
    with torch_pjrt.set_eager_mode("strict"):
        x = torch.randn(4).to("pjrt")
        out, rep, why = replay.capture(lambda: x + 1, [x])
    assert rep is None and "not fused" in why
    torch.testing.assert_close(out.cpu(), x.cpu() + 1)
