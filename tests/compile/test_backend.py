"""torch.compile(backend="pjrt"): compiled vs eager vs CPU parity, breaks, mutations, caching."""

import copy

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_as_accurate_as_cpu

import torch_pjrt
from torch_pjrt.demo.model import GPT, GPTConfig

# Compiled results are held to be as accurate as the CPU's against the same model run in
# float64 on the CPU (tests/tolerance.py): XLA's fusions and BLAS round differently, by
# amounts no literal states for every processor.


def _float64(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).double()


def _mlp():
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def test_inference_matches_cpu_and_eager():
    model = _mlp()
    dev = copy.deepcopy(model).to("pjrt")
    compiled = torch.compile(dev, backend="pjrt")
    x = torch.randn(16, 8)
    with torch.no_grad():
        out = compiled(x.to("pjrt"))
        reference = _float64(model)(x.double())
        assert_as_accurate_as_cpu(out, model(x), reference)
        assert_as_accurate_as_cpu(dev(x.to("pjrt")), model(x), reference)
    assert out.device.type == "pjrt"
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.AdamW, {"lr": 1e-2}),
                                        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})])
def test_training_matches_cpu(opt_cls, kw):
    torch.manual_seed(0)
    model = _mlp()
    dev = copy.deepcopy(model).to("pjrt")
    compiled = torch.compile(dev, backend="pjrt")
    wide = _float64(model)
    o_cpu, o_dev = opt_cls(model.parameters(), **kw), opt_cls(dev.parameters(), **kw)
    o_wide = opt_cls(wide.parameters(), **kw)
    for _ in range(4):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        for m, o, d, t in ((model, o_cpu, "cpu", torch.float32),
                           (compiled, o_dev, "pjrt", torch.float32),
                           (wide, o_wide, "cpu", torch.float64)):
            o.zero_grad()
            F.mse_loss(m(x.to(d, t)), y.to(d, t)).backward()
            o.step()
    assert_as_accurate_as_cpu(list(dev.parameters()), list(model.parameters()),
                              list(wide.parameters()))


def test_gpt_training_step_matches_cpu():
    torch.manual_seed(0)
    cfg = GPTConfig(layers=2, d_model=64, heads=4, seq_len=32)
    model = GPT(cfg)
    dev = copy.deepcopy(model).to("pjrt")
    compiled = torch.compile(dev, backend="pjrt")
    wide = _float64(model)
    o_cpu = torch.optim.AdamW(model.parameters(), lr=1e-3)
    o_dev = torch.optim.AdamW(dev.parameters(), lr=1e-3)
    o_wide = torch.optim.AdamW(wide.parameters(), lr=1e-3)
    for _ in range(3):
        x, y = torch.randint(0, 256, (4, 32)), torch.randint(0, 256, (4, 32))
        losses = []
        for m, o, d in ((model, o_cpu, "cpu"), (compiled, o_dev, "pjrt"), (wide, o_wide, "cpu")):
            _, loss = m(x.to(d), y.to(d))
            o.zero_grad()
            loss.backward()
            o.step()
            losses.append(loss.detach())
        assert_as_accurate_as_cpu(losses[1], losses[0], losses[2])
    assert torch_pjrt.metrics().get("compile_eager_graphs", 0) == 0


def test_graph_break_runs_the_middle_eagerly():
    def f(x):
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return (y + 1).cos()

    x = torch.randn(10)
    out = torch.compile(f, backend="pjrt")(x.to("pjrt"))
    torch.testing.assert_close(out.cpu(), f(x))  # (elementwise: the dtype's default bound)


def test_mutated_inputs_are_written_back():
    def f(buf, x):
        buf.add_(x)
        return buf * 2

    buf_cpu, x = torch.zeros(5), torch.randn(5)
    buf = buf_cpu.to("pjrt")
    fn = torch.compile(f, backend="pjrt")
    for _ in range(2):
        out = fn(buf, x.to("pjrt"))
        f(buf_cpu, x)
    torch.testing.assert_close(buf.cpu(), buf_cpu)
    torch.testing.assert_close(out.cpu(), buf_cpu * 2)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_outputs_that_view_another_output_share_its_storage(grad):
    """As in eager (and AOTAutograd without a compiler), an output that is a view of
    another output is that view, not a copy: writing one changes the other (found by the
    differential fuzzer, tests/fuzz)."""
    def f(x):
        y = x * x
        return y, y.expand(3, 2), y[1:], y.as_strided((), (), 1)

    x = torch.tensor([2.0, 3.0], requires_grad=grad)
    d = x.detach().to("pjrt").requires_grad_(grad)
    want = f(x)
    got = torch.compile(f, backend="pjrt")(d)
    for g, w in zip(got[1:], want[1:]):
        assert g._base is got[0]
        assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
    if grad:
        sum(o.sum() * (i + 1) for i, o in enumerate(got)).backward()
        sum(o.sum() * (i + 1) for i, o in enumerate(want)).backward()
        torch.testing.assert_close(d.grad.cpu(), x.grad)
        return
    with torch.no_grad():
        got[0].add_(1)
        want[0].add_(1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_outputs_returned_twice_or_split_from_another_output_alias_it():
    """The same tensor returned twice is one tensor (`v1 = v0.exp_()`), the pieces of
    split/unbind/chunk of an output share its storage, and a view of a view that is itself
    returned has that one as its base: as in eager and AOTAutograd without a compiler
    (pjrt returned separate copies until December 3; the differential fuzzer found it)."""
    def f(x):
        y = x.float()
        z = y.exp_()
        s = torch.stack([y, y], -1)
        d = s.detach()
        return y, z, s, s.chunk(3, 0)[0], s.unbind(1)[1], d, d.as_strided((), (), 1)

    got = torch.compile(f, backend="pjrt")(torch.tensor([1.0, 2.0]).to("pjrt"))
    want = f(torch.tensor([1.0, 2.0]))
    assert got[1] is got[0]
    assert got[3]._base is got[2] and got[4]._base is got[2]
    assert got[6]._base is got[5]
    with torch.no_grad():
        got[2].add_(1)
        want[2].add_(1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_one_compile_per_shape():
    counts = {"n": 0}

    def backend(gm, example_inputs):
        counts["n"] += 1
        from torch_pjrt.compile.backend import pjrt_backend

        return pjrt_backend(gm, example_inputs)

    fn = torch.compile(lambda x: (x * x).sum(-1), backend=backend, dynamic=False)
    for _ in range(3):
        fn(torch.randn(4, 3, device="pjrt"))
    assert counts["n"] == 1
    fn(torch.randn(5, 3, device="pjrt"))
    assert counts["n"] == 2


def test_dropout_draws_from_the_device_generator():
    def f(x):
        return F.dropout(x, 0.5, training=True)

    fn = torch.compile(f, backend="pjrt")
    x = torch.ones(1000, device="pjrt")
    torch.manual_seed(3)
    a = fn(x).cpu()
    torch.manual_seed(3)
    b = fn(x).cpu()
    assert torch.equal(a, b)
    assert 400 < (a == 0).sum() < 600
    assert not torch.equal(a, fn(x).cpu())


def test_default_backend_picks_pjrt_for_pjrt_tensors():
    model = _mlp()
    dev = copy.deepcopy(model).to("pjrt")
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = torch.compile(dev)(x.to("pjrt"))  # no backend given
        assert_as_accurate_as_cpu(out, model(x), _float64(model)(x.double()))
    assert torch_pjrt.metrics().get("compiled_graphs", 0) >= 1


def test_dynamic_shapes_one_graph_one_program_per_bucket():
    """Sizes are padded to buckets (docs/dynamic-shapes.md): (4, 3), (5, 7), (6, 2) run
    at (4, 4), (8, 8), (8, 2); the sum over dim 0 and the softmax over dim 1 are masked."""
    def f(x):
        return (x * 2).sum(0).softmax(-1) + torch.arange(x.shape[1], device=x.device)

    fn = torch.compile(f, backend="pjrt", dynamic=True)
    for shape in [(4, 3), (5, 7), (6, 2), (5, 7)]:
        x = torch.randn(*shape)
        assert_as_accurate_as_cpu(fn(x.to("pjrt")), f(x), f(x.double()))
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 1  # one Dynamo/AOT graph
    assert m["bucketed_graph_programs"] == 3


def test_recompile_warning_names_the_input_that_changed(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_BUCKETS", "0")  # one program per shape
    fn = torch.compile(lambda x: (x * 2).sum(), backend="pjrt", dynamic=True)
    with pytest.warns(UserWarning, match=r"compiled for 9 different inputs.*input 0"):
        for n in range(1, 12):
            fn(torch.randn(n, device="pjrt"))


def test_compiled_graphs_run_as_their_own_programs_in_fused_mode():
    """The eager code around a compiled graph fuses; the graph, already one XLA program,
    is not recorded into that code's graph (which would compile it again inside every
    different graph around it)."""
    fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="pjrt")
    x = torch.randn(16)
    with torch_pjrt.set_eager_mode("fused"):
        d = x.to("pjrt") + 1  # pending
        y = fn(d)  # runs that pending op, then the compiled program
        assert torch_pjrt.eager.graph.pending_ops() == 0
        z = y * 3 - 1
        assert torch_pjrt.eager.graph.pending_ops() == 2
        torch.testing.assert_close(z.cpu(), ((x + 1).sin() * 2).sum() * 3 - 1)


def test_whole_training_step_compiled():
    torch.manual_seed(0)
    model = _mlp()
    dev = copy.deepcopy(model).to("pjrt")
    o_cpu = torch.optim.AdamW(model.parameters(), lr=1e-2)
    o_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2)

    def make_step(m, o):
        def step(x, y):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            return loss
        return step

    wide = _float64(model)
    wide_step = make_step(wide, torch.optim.AdamW(wide.parameters(), lr=1e-2))
    cpu_step, dev_step = make_step(model, o_cpu), torch.compile(make_step(dev, o_dev),
                                                                backend="pjrt")
    for _ in range(3):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        assert_as_accurate_as_cpu(dev_step(x.to("pjrt"), y.to("pjrt")).detach(),
                                  cpu_step(x, y).detach(), wide_step(x.double(), y.double()))
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] >= 2 and m["cpu_fallbacks"] == {}


def test_training_at_a_second_shape_stays_compiled():
    """A new shape makes Dynamo trace symbolic graphs whose forward returns sizes for the
    backward: they are computed on the host, and no graph falls back to eager."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=64, seq_len=16, layers=1, d_model=32, heads=2)
    model = GPT(cfg)
    dev = copy.deepcopy(model).to("pjrt")
    wide = _float64(model)
    fn = torch.compile(dev, backend="pjrt")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager fallback warns
        for batch, seq in [(4, 16), (2, 8), (3, 12)]:
            x = torch.randint(0, cfg.vocab, (batch, seq))
            expected = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
            reference = F.cross_entropy(wide(x).flatten(0, 1), x.flatten())
            loss = F.cross_entropy(fn(x.to("pjrt")).flatten(0, 1), x.flatten().to("pjrt"))
            for t in (loss, expected, reference):
                t.backward()
            assert_as_accurate_as_cpu(loss, expected, reference)
    assert_as_accurate_as_cpu([p.grad for p in dev.parameters()],
                              [p.grad for p in model.parameters()],
                              [p.grad for p in wide.parameters()])


DIFFERENT_GRAPH = """
import torch, torch_pjrt
f = torch.compile(lambda x: torch.{fn}(x) * 2, backend="pjrt")
x = torch.linspace(-2, 2, 12).reshape(3, 4)
torch.testing.assert_close(f(x.to("pjrt")).cpu(), torch.{fn}(x) * 2)  # elementwise
m = torch_pjrt.metrics()
print("hits", m.get("disk_cache_hits", 0))
"""


def test_persistent_cache_tells_graphs_apart_across_processes(tmp_path):
    # Each process's first compiled graph has the same inputs; the programs differ.
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    for fn, warm in (("sin", False), ("cos", False), ("sin", True)):
        out = subprocess.run([sys.executable, "-c", DIFFERENT_GRAPH.format(fn=fn)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        hits = int(out.stdout.split()[-1])
        assert (hits > 0) == warm, (fn, out.stdout)


def test_boolean_attention_mask_compiles_to_one_program():
    """nn.MultiheadAttention turns a boolean mask into a float one with zeros_like (full_like
    in the graph): the graph still compiles whole, forward and backward."""
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(16, 2, batch_first=True)
    dev = copy.deepcopy(attn).to("pjrt")

    def f(m, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        filled = torch.full_like(x, 0.5) + torch.empty_like(x).fill_(1)
        return m(x, x, x, attn_mask=mask, need_weights=False)[0] * filled

    x = torch.randn(2, 6, 16)
    wide = _float64(attn)
    expected, reference = f(attn, x), f(wide, x.double())
    actual = torch.compile(f, backend="pjrt")(dev, x.to("pjrt"))
    for t in (expected, reference, actual):
        t.sum().backward()
    assert_as_accurate_as_cpu([actual, dev.in_proj_weight.grad],
                              [expected, attn.in_proj_weight.grad],
                              [reference, wide.in_proj_weight.grad])
    assert torch_pjrt.metrics().get("compile_eager_graphs", 0) == 0
