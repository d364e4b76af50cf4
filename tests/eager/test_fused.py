"""Fused eager: ops are recorded, flushed where a value is needed, cached by structure."""

import copy
import gc
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_as_accurate

import torch_pjrt
from torch_pjrt.eager import graph


@pytest.fixture(autouse=True)
def _fused():
    with torch_pjrt.set_eager_mode("fused"):
        yield
    torch_pjrt.counters.reset()


def test_ops_are_recorded_until_a_value_is_read():
    x = torch.randn(64, 64)
    d = x.to("pjrt")
    torch.pjrt.synchronize()
    torch_pjrt.counters.reset()
    y = ((d @ d).relu() + 1).sum(0)
    assert torch_pjrt.metrics().get("flushes", 0) == 0
    assert torch_pjrt.eager.graph.pending_ops() >= 4
    wide = x.double()
    assert_as_accurate(y.cpu(), ((x @ x).relu() + 1).sum(0), ((wide @ wide).relu() + 1).sum(0))
    m = torch_pjrt.metrics()
    assert m["flushes"] == 1 and m["flushes.data read"] == 1
    # the temporaries (d @ d, relu, + 1) died inside the graph: only y is materialized
    assert m["graph_outputs"] == 1 and m["graph_ops"] == 4


@pytest.mark.parametrize("read", [
    lambda t: t.item(), lambda t: t.tolist(), lambda t: bool(t > 0), lambda t: str(t),
    lambda t: t.cpu(),
])
def test_every_data_read_flushes(read):
    t = torch.randn(()).to("pjrt") * 3
    read(t)
    assert torch_pjrt.eager.graph.pending_ops() == 0


def test_data_dependent_shapes_inside_a_graph():
    x = torch.randn(50)
    d = x.to("pjrt")
    y = d * 2
    got = y[y > 0] + 1
    torch.testing.assert_close(got.cpu(), (x * 2)[x * 2 > 0] + 1)
    assert (d > 0).nonzero().shape == (x > 0).nonzero().shape


def test_shape_error_raises_at_the_op_and_the_graph_survives():
    a = torch.randn(3, 4).to("pjrt")
    b = a * 2
    with pytest.raises(RuntimeError):
        b @ b  # (3,4) @ (3,4): known without running anything
    c = b + 1
    torch.testing.assert_close(c.cpu(), a.cpu() * 2 + 1)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_error_only_the_lowering_knows_raises_at_the_op(mode):
    # PyTorch's meta kernel lets a bool scalar through; only the lowering (and the CPU
    # kernel) reject it. Fused mode traces a new signature where it is recorded, so the
    # error is the op's, as in strict mode, and the pending graph is left whole.
    with torch_pjrt.set_eager_mode(mode):
        xs = [torch.ones(3).to("pjrt")]
        kept = xs[0] * 2
        for _ in range(2):  # a failed signature is not cached: the second call raises too
            with pytest.raises(RuntimeError, match="Subtraction, the `-` operator"):
                torch._foreach_sub(xs, True)
        if mode == "fused":
            assert torch_pjrt.eager.graph.pending_ops() == 1  # kept's op, still pending
        torch.testing.assert_close(kept.cpu(), torch.full((3,), 2.0))
        torch.testing.assert_close(xs[0].cpu(), torch.ones(3))  # not written


def test_a_failed_graph_leaves_its_tensors_without_value_and_the_rest_working(monkeypatch):
    from torch_pjrt.runtime import compile_cache

    x = torch.arange(6.0).to("pjrt")
    with torch_pjrt.set_eager_mode("fused"):
        y = (x * 2).sin() + 1  # a graph of three ops: compiled at the read
        real = compile_cache.obtain  # (what loads or compiles every program)

        def failing(*args, **kwargs):
            raise RuntimeError("simulated XLA failure")

        monkeypatch.setattr(compile_cache, "obtain", failing)
        with pytest.raises(RuntimeError, match="simulated XLA failure"):
            y.cpu()
        monkeypatch.setattr(compile_cache, "obtain", real)
        for use in (lambda: y.cpu(), lambda: (y + 1).cpu()):  # no stale value, no crash
            with pytest.raises(RuntimeError, match="has no value.*simulated XLA failure"):
                use()
        z = (x * 3).cos() - 1  # the backend itself still works
        torch.testing.assert_close(z.cpu(), (torch.arange(6.0) * 3).cos() - 1)
        torch.pjrt.synchronize()  # with y, valueless, still alive
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def _mlp_steps(steps: int = 5) -> tuple[dict, list[float]]:
    """Metrics and losses of `steps` identical training steps of a small MLP, after 3 and
    the fused programs they started compiling."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16).to("pjrt"), torch.randn(8, 1).to("pjrt")

    def step():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    torch_pjrt.wait_for_compiles()  # (tiered: the fused programs may still be compiling)
    gc.collect()
    base_mem = torch.pjrt.memory_allocated()
    torch_pjrt.counters.reset()
    losses = [step() for _ in range(steps)]
    m = torch_pjrt.metrics()
    gc.collect()
    assert torch.pjrt.memory_allocated() == base_mem
    return m, losses


def test_identical_steps_reuse_their_programs_and_donate():
    m, _ = _mlp_steps()
    assert m.get("compiles", 0) == 0, m
    assert m["graph_cache_hits"] == m["flushes"] == 10  # a forward and a backward program
    assert m["flushes.backward"] == m["flushes.optimizer step"] == 5


def test_a_backward_pass_starts_a_program_of_its_own(monkeypatch):
    """TORCH_PJRT_FUSED_SPLIT_BACKWARD: the forward runs before the backward is recorded;
    with it off the step is one graph, where the forward's activations die inside. The
    losses are the same either way."""
    split, split_losses = _mlp_steps()
    monkeypatch.setattr(graph, "split_backward", False)
    whole, whole_losses = _mlp_steps()
    assert whole["flushes"] == whole["flushes.optimizer step"] == 5
    assert "flushes.backward" not in whole
    assert whole["graph_outputs"] < whole["graph_ops"] == split["graph_ops"]
    assert split["graph_outputs"] > whole["graph_outputs"]
    assert whole_losses == pytest.approx(split_losses, rel=1e-6)


def test_same_results_as_strict():
    torch.manual_seed(1)
    x = torch.randn(6, 6)
    outs = {}
    for mode in ("strict", "fused"):
        with torch_pjrt.set_eager_mode(mode):
            d = x.to("pjrt")
            v = d[1:4, ::2]
            v.mul_(3).add_(d[:3, :3])
            d.t()[0].zero_()
            outs[mode] = (d.cpu(), (d.softmax(0) @ d).cpu())
    torch.testing.assert_close(outs["fused"], outs["strict"])


def test_pending_graph_at_interpreter_exit():
    code = ("import torch, torch_pjrt\n"
            "torch_pjrt.set_eager_mode('fused')\n"
            "x = torch.randn(100, 100, device='pjrt')\n"
            "y = (x @ x).relu().sum()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "Error" not in out.stderr, out.stderr


def test_memory_pressure_flushes():
    from torch_pjrt.runtime import memory

    m = memory.device(0)
    old_limit = m.limit
    m.set_limit(m.allocated + 3_200_000)
    x = torch.zeros(250_000, device="pjrt")  # 1 MB
    kept = [x + 1]  # pending
    kept.append(x + 2)  # past 90% of the limit: the graph runs after this op
    assert torch_pjrt.eager.graph.pending_ops() == 0
    assert torch_pjrt.metrics().get("flushes.memory pressure", 0) == 1
    assert kept[1][0].item() == 2
    m.set_limit(old_limit)


def test_a_nested_backward_starts_no_program():
    """Reentrant checkpointing runs a backward inside the backward: one cut per step, at
    the outer backward's start, and the gradients are CPU PyTorch's."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    grads = {}
    for device in ("cpu", "pjrt"):
        model = copy.deepcopy(cpu).to(device)
        torch_pjrt.counters.reset()
        for _ in range(2):
            model.zero_grad()
            checkpoint(model, x.to(device).requires_grad_(), use_reentrant=True).sum().backward()
        grads[device] = [p.grad.cpu() for p in model.parameters()]
        if device == "pjrt":
            assert torch_pjrt.metrics()["flushes.backward"] == 2
    for a, b in zip(grads["cpu"], grads["pjrt"]):
        torch.testing.assert_close(a, b)
