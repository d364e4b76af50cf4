"""Views at other offsets of one storage share a program: a read view's offset is a
run-time value (call_key.dynamic_offset), in the Python key and the native key alike.
Differential against CPU PyTorch in every eager mode; the compile counts show the sharing."""

import copy

import pytest
import torch
from helpers import float64
from tolerance import assert_as_accurate

import torch_pjrt

pytestmark = pytest.mark.usefixtures("eager_mode")


def _compiles() -> int:
    return torch_pjrt.metrics().get("compiles", 0)


def _check(fn, *cpu_args):
    got = fn(*[a.to("pjrt") for a in cpu_args])
    assert_as_accurate(got.cpu(), fn(*cpu_args), fn(*float64(list(cpu_args))))


def test_a_pool_of_batches_compiles_once_for_every_nonzero_offset(monkeypatch):
    from torch_pjrt.eager import tiers

    # each flush runs its graph's own program (tiered execution would compile a graph's
    # program at its second use, or load its ops' programs from disk: counts that say
    # nothing of the offsets' sharing, which this test is about)
    torch_pjrt.ensure_initialized()
    monkeypatch.setattr(tiers, "enabled", False)
    torch.manual_seed(0)
    data, w = torch.randn(12, 8, 4), torch.randn(4, 3)
    d, dw = data.to("pjrt"), w.to("pjrt")
    counts = []
    for i in range(12):
        before = _compiles()
        got = torch.nn.functional.gelu(d[i] @ dw).softmax(-1).sum(0)
        expected, reference = (torch.nn.functional.gelu(t[i] @ v).softmax(-1).sum(0)
                               for t, v in ((data, w), (data.double(), w.double())))
        assert_as_accurate(got.cpu(), expected, reference)
        counts.append(_compiles() - before)
    assert sum(counts[2:]) == 0, counts  # offset 0, then one program for every other


def test_slices_and_narrow_views_at_run_time_offsets():
    x = torch.randn(64)
    for start in (0, 1, 7, 30, 56):
        _check(lambda t, start=start: t[start:start + 8] * 3 - t[start // 2:start // 2 + 8], x)
        _check(lambda t, start=start: t.narrow(0, start, 8).exp(), x)
    m = torch.randn(10, 6)
    for row in range(10):
        _check(lambda t, row=row: t[row].cumsum(0) + t[row:row + 1].sum(), m)


def test_a_loop_over_columns_compiles_once(monkeypatch):
    """Strided views (a column, a strided window) at run-time offsets too: PyTorch's
    test_sort compares each column with the next, 2,048 of them (a program per column
    before: 68 ms a column in strict mode, 12 ms fused; 1 ms now)."""
    from torch_pjrt.eager import tiers

    torch_pjrt.ensure_initialized()
    monkeypatch.setattr(tiers, "enabled", False)
    m = torch.sort(torch.rand(4, 40))[0]
    d = m.to("pjrt")
    counts = []
    for k in range(1, 40):
        before = _compiles()
        assert ((d[:, k] != d[:, k]) | (d[:, k - 1] <= d[:, k])).all().item()
        counts.append(_compiles() - before)
    assert sum(counts[3:]) == 0, counts
    for k in (1, 5, 37):
        _check(lambda t, k=k: t[:, k] * 2 + t[::2, k - 1].repeat(2), m)
        _check(lambda t, k=k: t[1:, k:k + 2].exp() - t[::3, k - 1::7].sum(), m)


def test_the_same_storage_read_at_two_offsets_and_written_at_a_third():
    base = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    for i in range(10):
        def fn(t, i=i):
            t = t.clone()
            t[i].add_(t[(i + 3) % 10] * t[(i + 7) % 10])  # written view: static offset
            return t
        _check(fn, base)


def test_out_and_in_place_into_views_at_offsets():
    base = torch.randn(6, 5)
    for i in range(6):
        def fn(t, i=i):
            t = t.clone()
            torch.mul(t[(i + 1) % 6], 2, out=t[i])
            t[i].mul_(t[(i + 2) % 6])
            return t
        _check(fn, base)


def test_tensor_lists_of_views_at_offsets():
    base = torch.randn(8, 3)
    for i in range(1, 6):
        _check(lambda t, i=i: torch.cat([t[i], t[i + 1], t[0]]), base)
        _check(lambda t, i=i: torch.stack(torch._foreach_mul([t[i], t[i + 2]], 2.0)), base)


def test_reinterpreted_views_at_offsets():
    x = torch.randn(16)
    for start in (0, 2, 5):
        _check(lambda t, start=start: t[start:start + 4].view(torch.int32) & 0xFFFF, x)
        _check(lambda t, start=start: t.view(torch.int32)[start:start + 4] >> 3, x)


def test_python_and_native_keys_read_the_same_offsets():
    """Keyword arguments take the Python key, positional ones the native key: both must
    pass the offset at the same place among the run-time values."""
    x = torch.randn(20)
    for s in (3, 9, 3, 9):
        _check(lambda t, s=s: torch.add(t[s:s + 5], t[s + 1:s + 6], alpha=2.0), x)
        _check(lambda t, s=s: torch.add(t[s:s + 5], t[s + 1:s + 6]), x)
        _check(lambda t, s=s: t[s:s + 5] + 2.5 * t[2 + s:s + 7], x)


def test_overlapping_views_at_run_time_offsets_are_refused_as_on_the_cpu():
    """Views of one storage at run-time offsets share a program, but whether a written view
    overlaps a read one is a matter of their offsets: x[0:9].copy_(x[1:10]) has the shapes
    and strides of x[0:9].copy_(x[9:18]), which the CPU takes, and the CPU refuses it; so
    does pjrt, after the disjoint call as before it (PyTorch's test_copy_mem_overlap)."""
    cases = {
        "copy_": lambda x, s: x[0:9].copy_(x[s:s + 9]),
        "out=": lambda x, s: torch.add(x[s:s + 9], 1, out=x[0:9]),
        "in place": lambda x, s: x[0:9].mul_(x[s:s + 9]),
        "out= with a keyword": lambda x, s: torch.add(x[s:s + 9], 1, alpha=2, out=x[0:9]),
    }
    for name, fn in cases.items():
        for s in (9, 1, 10, 2, 9, 1):  # disjoint or overlapping, each one again
            cpu = torch.arange(20.0)
            dev = cpu.to("pjrt")
            try:
                fn(cpu, s)
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match="unsupported operation"):
                    fn(dev, s)
                    torch.pjrt.synchronize()
                assert "unsupported operation" in str(e), e
                continue
            fn(dev, s)
            assert torch.equal(dev.cpu(), cpu), (name, s)


def test_conjugate_and_negative_views_at_offsets():
    z = torch.randn(12, dtype=torch.complex64)
    for start in (0, 4):
        _check(lambda t, start=start: t[start:start + 4].conj() * 2, z)
        _check(lambda t, start=start: torch._neg_view(t[start:start + 4]) + 1, z)


def test_a_training_loop_over_a_device_pool_stops_compiling():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    xs, ys = torch.randn(10, 5, 6), torch.randn(10, 5, 1)
    cpu, dev = model, copy.deepcopy(model).to("pjrt")
    dx, dy = xs.to("pjrt"), ys.to("pjrt")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1)
    late = 0
    for step in range(10):
        before = _compiles()
        for m, o, x, y in ((cpu, opt_c, xs, ys), (dev, opt_d, dx, dy)):
            loss = torch.nn.functional.mse_loss(m(x[step]), y[step])
            o.zero_grad()
            loss.backward()
            o.step()
            if m is dev:
                got = loss.item()
            else:
                want = loss.item()
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        if step >= 3:
            late += _compiles() - before
    assert late == 0


def _writes(x, k):
    """Writes into views of x at offsets that move with k: rows, columns, strided windows,
    out=, a foreach list and copy_."""
    x[k] = x[k + 1] * 2 + k
    x[:, k] += 1
    torch.add(x[:, k], 1, out=x[:, k + 1])
    torch.mul(x[3:5, k:k + 3], 2, out=x[7:9, k:k + 3])
    torch._foreach_add_([x[k + 2], x[k + 4, 1:5]], 3)
    x[k:k + 9:4, 2] = x[k:k + 9:4, 3] * 5
    x[k].copy_(x[k + 3])
    return x


def test_writes_at_run_time_offsets(monkeypatch):
    """A written view's offset is a run-time value too: the write reads the span it
    covers, writes it and puts it back (views.write_at). A loop writing row k or column k
    runs one program per op (a program per row and op before: 30 ms a row in strict
    mode, 0.7 ms now)."""
    from torch_pjrt.eager import tiers

    torch_pjrt.ensure_initialized()
    monkeypatch.setattr(tiers, "enabled", False)
    torch.manual_seed(0)
    cpu = torch.randn(20, 12)
    dev = cpu.to("pjrt")
    counts = []
    for k in range(1, 9):
        before = _compiles()
        _writes(dev, k)
        _writes(cpu, k)
        assert torch.equal(dev.cpu(), cpu), k
        counts.append(_compiles() - before)
    assert sum(counts[3:]) == 0, counts
