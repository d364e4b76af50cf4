"""The native kernel of lowered ops (runtime/native/op_kernel.cpp): the fused hits it
records without Python code leave the same graph, storage table, memory account and
counters as the Python path would, and every call it hands on keeps its arguments."""

import pytest
import torch

import torch_pjrt
from torch_pjrt.eager import graph
from torch_pjrt.storage import table


@pytest.fixture
def fused():
    with torch_pjrt.set_eager_mode("fused"):
        torch.pjrt.synchronize()
        yield
        torch.pjrt.synchronize()


def _warm(fn, *args):
    for _ in range(3):  # compile, file the native key, then the native hit
        fn(*args)
    torch.pjrt.synchronize()


def test_native_records_keep_the_accounting(fused):
    a, b = torch.randn(64, device="pjrt"), torch.randn(64, device="pjrt")
    _warm(torch.add, a, b)
    torch_pjrt.counters.reset()
    allocated = torch.pjrt.memory_allocated()
    outs = [a + b for _ in range(5)]
    assert graph.pending_ops() == 5
    assert torch_pjrt.metrics()["cache_hits"] == 5
    assert torch.pjrt.memory_allocated() == allocated + 5 * 64 * 4
    for t in outs:
        rec = table.record_of(t)
        assert type(rec.value) is graph.Lazy and rec.numel == 64 and rec.nbytes == 256
    want = (a.cpu() + b.cpu())
    for t in outs:
        torch.testing.assert_close(t.cpu(), want)
    assert graph.pending_ops() == 0
    del outs, t
    assert torch.pjrt.memory_allocated() == allocated


def test_a_chain_of_native_records_fuses_into_one_graph(fused):
    x = torch.randn(32)
    d = x.to("pjrt")
    _warm(lambda: ((d * 2.5 + 1) * d).sum())
    torch_pjrt.counters.reset()
    got = ((d * 2.5 + 1) * d).sum()
    assert graph.pending_ops() == 4
    torch.testing.assert_close(got.cpu(), ((x * 2.5 + 1) * x).sum())
    assert torch_pjrt.metrics()["flushes"] == 1


def test_python_numbers_are_run_time_values(fused):
    x = torch.randn(8)
    d = x.to("pjrt")
    for v in (2.5, -1.0, 3, True, 0.5):
        for _ in range(2):
            torch.testing.assert_close((d * v).cpu(), x * v)


def test_the_size_cap_flushes(fused, monkeypatch):
    a = torch.randn(8, device="pjrt")
    _warm(torch.neg, a)
    monkeypatch.setattr(graph, "max_ops", 4)
    torch_pjrt.counters.reset()
    outs = [-a for _ in range(9)]
    assert torch_pjrt.metrics().get("flushes.size cap") == 2
    assert graph.pending_ops() == 1
    for t in outs:
        torch.testing.assert_close(t.cpu(), -a.cpu())


def test_a_graph_for_another_device_runs_first(fused):
    a, c = torch.randn(8, device="pjrt:0"), torch.randn(8, device="pjrt:1")
    _warm(torch.neg, a)
    _warm(torch.neg, c)
    torch_pjrt.counters.reset()
    x, y = -a, -c
    assert torch_pjrt.metrics().get("flushes.device change") == 1
    assert y.device == torch.device("pjrt:1")
    torch.testing.assert_close(x.cpu(), -a.cpu())
    torch.testing.assert_close(y.cpu(), -c.cpu())


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_keyword_dtype_and_out_arguments(mode):
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    with torch_pjrt.set_eager_mode(mode):
        a, b = x.to("pjrt"), y.to("pjrt")
        for _ in range(3):
            torch.testing.assert_close(torch.add(a, b, alpha=2).cpu(), torch.add(x, y, alpha=2))
            torch.testing.assert_close(a.sum(1, dtype=torch.float64).cpu(),
                                       x.sum(1, dtype=torch.float64))
            out = torch.empty(4, 3, device="pjrt")
            r = torch.mul(a, b, out=out)
            assert r is out
            torch.testing.assert_close(out.cpu(), x * y)
            torch.testing.assert_close(torch.max(a, 1).values.cpu(), torch.max(x, 1).values)
            torch.testing.assert_close(a.to(torch.float16).cpu(), x.to(torch.float16))
            c = a.clone(memory_format=torch.contiguous_format)
            torch.testing.assert_close(c.add_(1).cpu(), x + 1)


def test_errors_keep_their_type(fused):
    a = torch.randn(8, device="pjrt")
    _warm(torch.neg, a)
    with pytest.raises(RuntimeError, match="must match the size"):
        a + torch.randn(3, device="pjrt")
    with pytest.raises(IndexError):
        a.reshape(2, 4).sum(5)
    torch.testing.assert_close((-a).cpu(), -a.cpu())


def test_pending_ops_add_little_for_the_cyclic_gc(fused):
    """A pending op is the result tensor and its storage record for the GC: the node, the
    lazy value and the node's inputs are untracked (they are in no cycle)."""
    import gc

    a, b = torch.randn(8, device="pjrt"), torch.randn(8, device="pjrt")
    _warm(torch.add, a, b)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        outs = [a + b for _ in range(200)]
        per_op = (len(gc.get_objects()) - before) / len(outs)
    finally:
        gc.enable()
    assert per_op <= 2.05
    torch.testing.assert_close(outs[-1].cpu(), a.cpu() + b.cpu())


def test_in_place_records_write_their_storages(fused):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    a, b = x.to("pjrt"), y.to("pjrt")
    c = a.clone()
    view = c[1:3]
    _warm(lambda: view.add_(b[:2]))
    torch_pjrt.counters.reset()
    want = x.clone()
    for _ in range(3):
        want[1:3] += y[:2]
    got = c.clone()
    # the same in-place op three more times, on a storage with a pending value
    for _ in range(3):
        r = view.add_(b[:2])
        assert r is view
    assert graph.pending_ops() == 4
    assert type(table.record_of(c).value) is graph.Lazy
    want2 = want.clone()
    for _ in range(3):
        want2[1:3] += y[:2]
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(c.cpu(), want2)
    torch.testing.assert_close(view.cpu(), want2[1:3])
    # a parameter-like update: its old buffer is donated at the flush
    p = x.to("pjrt")
    _warm(lambda: p.mul_(0.5))
    p.mul_(0.5)
    torch.testing.assert_close(p.cpu(), x * 0.5 ** 4)
