"""Layouts of what compiled graphs hand each other: saved activations stay compact."""

import torch
from tolerance import assert_as_accurate

import torch_pjrt  # noqa: F401


def _saved_bytes(fn, *args) -> int:
    torch.pjrt.synchronize()
    before = torch.pjrt.memory_allocated()
    out = fn(*args)
    torch.pjrt.synchronize()
    grown = torch.pjrt.memory_allocated() - before - out.numel() * out.element_size()
    out.sum().backward()
    return grown


def test_saved_views_of_one_buffer_are_not_padded_out_to_it():
    # q, k and v are views of one [n, 3d] buffer; the backward needs all three. Saved
    # with their view strides, each would be a copy of (nearly) the whole buffer.
    n, d = 256, 128
    lin = torch.nn.Linear(d, 3 * d).to("pjrt")

    def f(x):
        q, k, v = lin(x).split(d, dim=1)
        return (q * k * v).sum(1)

    compiled = torch.compile(f, backend="pjrt")
    x = torch.randn(n, d, device="pjrt", requires_grad=True)
    compiled(x).sum().backward()  # compile first
    grown = _saved_bytes(compiled, x)
    one_view = n * d * 4
    # saved: q, k, v and q * k: 4 views (with the weight's transpose copied: 5.5; with
    # q, k and v padded out to the whole buffer: 11.5)
    assert grown <= 4.25 * one_view, (grown, one_view)


def test_saved_views_of_inputs_are_views_not_copies():
    # The backward of x @ w.t() needs w.t(): a view of the weight, not a copy of it.
    w = torch.randn(512, 256, requires_grad=True)
    x = torch.randn(8, 256, requires_grad=True)
    wd, xd = (t.detach().to("pjrt").requires_grad_(True) for t in (w, x))
    compiled = torch.compile(lambda x, w: torch.tanh(x @ w.t()), backend="pjrt")
    compiled(xd, wd).sum().backward()
    wd.grad = xd.grad = None
    grown = _saved_bytes(compiled, xd, wd)
    assert grown < w.numel() * 4 // 4, grown  # x and tanh(...) only: 24 KB, the weight 512 KB
    torch.tanh(x @ w.t()).sum().backward()
    w64, x64 = (t.detach().double().requires_grad_() for t in (w, x))
    torch.tanh(x64 @ w64.t()).sum().backward()
    assert_as_accurate(wd.grad.cpu(), w.grad, w64.grad)  # (tests/tolerance.py)
    assert_as_accurate(xd.grad.cpu(), x.grad, x64.grad)


def test_as_strided_over_a_partial_view_reads_its_storage():
    """as_strided addresses the input's storage, not the view: over a view that covers part
    of its storage it reads the elements beyond the view, as on the CPU."""
    def f(x):
        return x.as_strided((3, 3), (1, 3), 2) * 2

    base = torch.arange(20.0)
    view = base[4:10]
    dev = base.to("pjrt")[4:10]
    for fn in (f, torch.compile(f, backend="pjrt", dynamic=False)):
        torch.testing.assert_close(fn(dev).cpu(), f(view))
