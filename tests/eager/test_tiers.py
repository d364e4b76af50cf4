"""Fused eager's first calls: a graph runs op by op while its fused program compiles in the
background (eager/tiers.py), and a loop's repeating step compiles once (eager/loops.py).
Results equal the CPU's on either path, and random ops draw the same numbers."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_as_accurate

import torch_pjrt
from torch_pjrt.eager import graph, loops, tiers
from torch_pjrt.runtime import compile_pool


@pytest.fixture(autouse=True)
def _fused(monkeypatch):
    torch_pjrt.ensure_initialized()  # (first in a process, it reads the settings anew)
    monkeypatch.setenv("TORCH_PJRT_COMPILE_CACHE", "0")  # a program seen is compiled here
    monkeypatch.setattr(tiers, "PREFER_OPS", 1e9)  # op by op wherever a graph may
    monkeypatch.setattr(tiers, "enabled", True)
    monkeypatch.setattr(loops, "enabled", True)
    with torch_pjrt.set_eager_mode("fused"):
        yield
    torch_pjrt.wait_for_compiles()


def _weights(device, dim=16, vocab=32):
    g = torch.Generator().manual_seed(0)
    w = {"emb": torch.randn(vocab, dim, generator=g), "out": torch.randn(dim, vocab, generator=g)}
    return {k: v.to(device) for k, v in w.items()}


def _generate(w, steps: int, length: int = 32) -> torch.Tensor:
    """Greedy decoding with a static cache written in place: the same ops every step and
    nothing read back until the end, so the whole loop is one pending graph."""
    device = w["emb"].device
    cache = torch.zeros(length, w["emb"].shape[1], device=device)
    token = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.zeros(1, dtype=torch.long, device=device)
    out = []
    for _ in range(steps):
        x = w["emb"][token]  # [1, dim]
        cache.index_copy_(0, pos, x)
        att = (cache @ x.T).softmax(0)  # [length, 1]
        h = torch.tanh((att * cache).sum(0, keepdim=True) + x)
        token = (h @ w["out"]).argmax(-1)
        out.append(token)
        pos = pos + 1
    return torch.cat(out)


def test_a_decode_loop_compiles_its_step_once(monkeypatch):
    monkeypatch.setattr(tiers, "enabled", False)  # every program compiled at its flush
    expected = _generate(_weights("cpu"), 20)
    w = _weights("pjrt")
    torch.pjrt.synchronize()
    torch_pjrt.counters.reset()
    assert torch.equal(_generate(w, 20).cpu(), expected)
    m = torch_pjrt.metrics()
    assert m["graph_loops"] == 1
    first = m["compiles"]
    assert first <= 3  # the step, and what comes before and after it
    assert torch.equal(_generate(w, 28).cpu(), _generate(_weights("cpu"), 28))
    # eight more steps: the step's program again; at most a new rest (its cat) and prefix
    assert torch_pjrt.metrics()["compiles"] - first <= 2
    monkeypatch.setattr(loops, "enabled", False)
    graph.forget()
    torch_pjrt.counters.reset()
    assert torch.equal(_generate(w, 20).cpu(), expected)  # unrolled: one program
    assert torch_pjrt.metrics()["compiles"] == 1 and "graph_loops" not in torch_pjrt.metrics()


def test_a_step_switches_to_its_fused_program_within_the_flush(monkeypatch):
    """A step's fused program compiled while the flush runs serves the steps after it."""
    from torch_pjrt.eager import program

    queue = program.Program.compile_in_background

    def at_once(self, args):  # the compile finishes before the next step starts
        queue(self, args)
        compile_pool.wait()

    monkeypatch.setattr(program.Program, "compile_in_background", at_once)
    monkeypatch.setattr(tiers, "_pays_now", lambda piece, steps=None: True)
    expected = _generate(_weights("cpu"), 20)
    w = _weights("pjrt")
    graph.forget()
    torch_pjrt.counters.reset()
    assert torch.equal(_generate(w, 20).cpu(), expected)
    m = torch_pjrt.metrics()
    assert m["flushes"] == 1 and m["graph_loops"] == 1 and m["background_compiles"] == 1
    # op by op: the prefix, the first two steps (the second queued the compile), the rest
    assert m["tiered_pieces"] <= 4


def _queued_when(monkeypatch) -> list:
    """Records, per background compile queued, the pieces run op by op until then."""
    from torch_pjrt.eager import program

    queue = program.Program.compile_in_background
    at: list = []

    def noted(self, args):
        at.append(torch_pjrt.metrics().get("tiered_pieces", 0))
        queue(self, args)

    monkeypatch.setattr(program.Program, "compile_in_background", noted)
    return at


def test_tiered_decode_runs_op_by_op_then_its_fused_step(monkeypatch):
    """The decode loop runs op by op; its step recurs within the flush, and on two cores its
    fused compile (and only it: the prefix and the rest are seen once) starts once the flush
    is done, since beside a short loop it would slow the loop's op by op run by more than it
    gains; the next flush runs the step's program."""
    monkeypatch.setattr(compile_pool, "threads", lambda: 2)
    at = _queued_when(monkeypatch)
    expected = _generate(_weights("cpu"), 20)
    w = _weights("pjrt")
    graph.forget()
    torch_pjrt.counters.reset()
    assert torch.equal(_generate(w, 20).cpu(), expected)
    m = torch_pjrt.metrics()
    assert m["graph_loops"] == 1 and m["tiered_pieces"] >= 19
    assert m["background_compiles_queued"] == 1
    assert at == [m["tiered_pieces"]]  # queued after every piece ran
    torch_pjrt.wait_for_compiles()
    before = torch_pjrt.metrics()["tiered_ops"]
    assert torch.equal(_generate(w, 20).cpu(), expected)
    m = torch_pjrt.metrics()
    # the steps ran their fused program; only the pieces seen once ran op by op
    assert m["background_compiles"] >= 1
    assert m["tiered_ops"] - before < m["tiered_ops"] // 4


def test_a_loop_compiles_its_step_beside_it_where_that_pays(monkeypatch):
    """With cores to spare, or a loop long enough to pay for the compile, the step's fused
    program starts compiling at the flush's start, before the loop reaches it."""
    at = _queued_when(monkeypatch)
    expected = _generate(_weights("cpu"), 20)
    w = _weights("pjrt")
    for cores, steps in ((4, 20), (2, 800)):
        monkeypatch.setattr(compile_pool, "threads", lambda cores=cores: cores)
        monkeypatch.setattr(tiers, "OP_LAUNCH", tiers.OP_LAUNCH * steps / 20)
        graph.forget()
        compile_pool.cancel()
        torch_pjrt.counters.reset()
        at.clear()
        assert torch.equal(_generate(w, 20).cpu(), expected)
        m = torch_pjrt.metrics()
        assert m["background_compiles_early"] == 1 and at[0] <= 1, (cores, steps, at)


def test_a_step_that_cannot_run_op_by_op_raises_its_failed_compile(monkeypatch):
    """A step that cannot run op by op waits for its fused compile started at the flush's
    start; where that compile failed, the step compiles here and its error reaches the
    user (it may not fall back to op by op)."""
    import threading
    import time

    from torch_pjrt.eager import schedule
    from torch_pjrt.runtime import compile_cache

    monkeypatch.setattr(compile_pool, "threads", lambda: 4)
    finish = schedule._finish

    def no_op_by_op(piece, *args):
        finish(piece, *args)
        piece.per_op = False

    monkeypatch.setattr(schedule, "_finish", no_op_by_op)
    failing: set = set()
    obtain = compile_cache.obtain

    def failing_obtain(jitted, args, name, *rest, **kw):
        if threading.current_thread().name.startswith("pjrt-compile-bg"):
            failing.add(name)
            time.sleep(1.0)  # still compiling when the loop reaches its first step
        if name in failing:
            raise RuntimeError("injected compile failure")
        return obtain(jitted, args, name, *rest, **kw)

    monkeypatch.setattr(compile_cache, "obtain", failing_obtain)
    run_ops = tiers.run_ops
    by_ops: list = []

    def noted_run_ops(piece, *args):
        by_ops.append(piece.per_op)
        return run_ops(piece, *args)

    monkeypatch.setattr(tiers, "run_ops", noted_run_ops)
    w = _weights("pjrt")
    graph.forget()
    torch_pjrt.counters.reset()
    with pytest.raises(RuntimeError, match="injected compile failure"):
        _generate(w, 20).cpu()
    assert failing and torch_pjrt.metrics()["background_compiles_waited"] >= 1
    assert by_ops == []  # no piece ran op by op


def test_a_loop_whose_shapes_change_every_flush_queues_no_compile_per_flush():
    """A layer stack recurs within each flush; where its input's length changes from flush
    to flush (a dynamic KV cache), each flush's layer program is new and seen once more
    at most: compiling it would cost a fused compile per flush for nothing."""
    torch.manual_seed(0)
    ws = [torch.randn(16, 16).to("pjrt") for _ in range(2)]
    graph.forget()
    torch_pjrt.counters.reset()
    for length in range(5, 10):
        y = torch.randn(length, 16).to("pjrt")
        for _ in range(10):  # ten layers of the same ops
            y = (y @ ws[0]).tanh() * 0.5 + (y @ ws[1]).sigmoid() - y.sin() / 4
        y.sum().item()
    m = torch_pjrt.metrics()
    assert m["graph_loops"] == 5 and m["recompiles"] >= 4
    assert m["background_compiles_queued"] == 1  # the first flush's (nothing told it yet)


def _decode_in_new_processes(cache_dir, calls: tuple[int, ...], counters: tuple[str, ...]):
    """The zoo-like decode loop (_generate, 20 steps) run in one new process per element of
    `calls` (that many generates each, waiting for the background compiles after each) on
    one compile cache directory: per process, its tokens and these counters."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        "import sys, torch, torch_pjrt\n"
        f"sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]\n"
        "from test_tiers import _generate, _weights\n"
        "from torch_pjrt.eager import tiers\n"
        "tiers.PREFER_OPS = 1e9\n"
        "torch_pjrt.set_eager_mode('fused')\n"
        "w = _weights('pjrt')\n"
        "torch.pjrt.synchronize()\n"
        "torch_pjrt.counters.reset()\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    tokens = _generate(w, 20).tolist()\n"
        "    torch_pjrt.wait_for_compiles()\n"
        "m = torch_pjrt.metrics()\n"
        f"print('RESULT', tokens, *[m.get(k, 0) for k in {list(counters)!r}])\n")
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache_dir), TORCH_PJRT_COMPILE_CACHE="1")
    runs = []
    for n in calls:
        done = subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True,
                              text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
        tokens, counts = line.split("] ")
        runs.append((tokens, [int(c) for c in counts.split()]))
    return runs


def test_a_new_process_runs_the_step_a_loop_compiled_in_the_background(tmp_path):
    """The first flush of a decode loop leaves its step's fused program on disk; a new
    process loads it and runs the steps fused, compiling nothing."""
    (cold_tokens, cold), (warm_tokens, warm) = _decode_in_new_processes(
        tmp_path, (1, 1), ("xla_compiles", "tiered_pieces", "background_compiles"))
    assert cold_tokens == warm_tokens
    cold_xla, cold_pieces, cold_bg = cold
    warm_xla, warm_pieces, warm_bg = warm
    assert cold_xla > 0 and cold_pieces >= 19 and cold_bg == 1
    # warm: nothing compiled; the steps ran fused, only the prefix and the rest op by op
    assert warm_xla == 0 and warm_pieces <= 2 and warm_bg == 0


def test_a_new_process_runs_a_loop_whole_from_its_first_flush(tmp_path):
    """A process that ran a loop until its whole graph's program compiled (after its pieces'
    programs) leaves that program on disk; a new process runs the loop whole from its first
    flush: not op by op, not in pieces, queueing no load for later (it ran the pieces for
    some ten flushes before: a warm training loop's first steps ran slower than its cold
    one's last)."""
    (cold_tokens, cold), (warm_tokens, warm) = _decode_in_new_processes(
        tmp_path, (3, 2), ("xla_compiles", "tiered_pieces", "background_compiles_queued",
                           "graph_loops_unrolling"))
    assert cold_tokens == warm_tokens
    assert cold[0] > 0 and cold[3] == 1  # the whole graph compiled, after the pieces
    assert warm == [0, 0, 0, 0], warm  # no compile, nothing op by op, nothing queued


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Dropout(0.0),
                               torch.nn.Linear(24, 1))


def _train(device: str, steps: int, wait_at: int | None = None,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The losses of `steps` AdamW steps (float64 on the CPU: the reference that pjrt's and
    the CPU's float32 losses are both measured against, tests/tolerance.py)."""
    model = _mlp().to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 12, generator=g), torch.randn(16, 1, generator=g))
            for _ in range(3)]
    data = [(x.to(device, dtype), y.to(device, dtype)) for x, y in data]
    losses = []
    for i in range(steps):
        if i == wait_at:
            torch_pjrt.wait_for_compiles()
        x, y = data[i % 3]
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=dtype)


def _as_accurate(losses: torch.Tensor, expected: torch.Tensor, steps: int) -> None:
    assert_as_accurate(losses, expected[:steps], _train("cpu", steps, dtype=torch.float64))


def test_a_training_loop_switches_to_its_fused_step_with_the_same_losses():
    expected = _train("cpu", 9)
    torch_pjrt.counters.reset()
    got = _train("pjrt", 9, wait_at=5)
    _as_accurate(got, expected, 9)
    m = torch_pjrt.metrics()
    assert m["tiered_pieces"] > 0 and m["background_compiles"] >= 1
    # after the switch: the step's fused programs; only the first forward (before any
    # backward: seen once before) runs op by op once more, and compiles the programs of
    # the exact ops its first run computed on the host (eager/host_ops.py), nothing else
    torch_pjrt.wait_for_compiles()
    compiles = torch_pjrt.metrics()["compiles"]
    tiered = torch_pjrt.metrics()["tiered_pieces"]
    on_host = torch_pjrt.metrics().get("host_ops", 0)
    _as_accurate(_train("pjrt", 6), expected, 6)
    m = torch_pjrt.metrics()
    assert m["compiles"] - compiles <= on_host and m["tiered_pieces"] - tiered <= 1


def test_op_by_op_is_bit_identical_to_strict_mode():
    """Before its fused program is compiled a graph runs the programs strict mode runs,
    on the same inputs: the same bits (the fused program may round differently: it is
    compared with the CPU in the tests above)."""
    with torch_pjrt.set_eager_mode("strict"):
        strict = _train("pjrt", 3)
    graph.forget()
    tiered = _train("pjrt", 3)
    assert torch.equal(tiered, strict)


def test_random_ops_draw_the_same_numbers_op_by_op_and_fused(monkeypatch):
    x = torch.randn(64, 64).to("pjrt")

    def draw():
        torch.manual_seed(7)
        a, b, c = F.dropout(x, 0.5), torch.rand_like(x), torch.randn_like(x)
        return [t.cpu() for t in (a, b, c, (a * 3 + b).relu() - c)]

    graph.forget()
    tiered = draw()
    assert torch_pjrt.metrics()["tiered_pieces"] >= 1
    monkeypatch.setattr(tiers, "enabled", False)
    graph.forget()
    fused = draw()
    for t, f in zip(tiered[:3], fused[:3]):  # the draws: the same bits
        assert torch.equal(t, f)
    # arithmetic on them: XLA's fusion may contract a * 3 + b into one rounding (1 ulp)
    torch.testing.assert_close(tiered[3], fused[3])  # (float32's elementwise bound)


def test_deterministic_algorithms_run_each_graph_as_its_program():
    torch.use_deterministic_algorithms(True)
    try:
        graph.forget()
        x = torch.randn(32, 32).to("pjrt")
        (x.exp() * 2 + x.sin()).sum().item()
    finally:
        torch.use_deterministic_algorithms(False)
    assert "tiered_pieces" not in torch_pjrt.metrics()


@pytest.mark.parametrize("how", ["tiering off", "deterministic"])
def test_where_compiles_block_a_loop_keeps_its_step_programs(monkeypatch, how):
    """Tiering off or deterministic algorithms: a loop's graph runs the programs compiled
    at its first flush for good. No whole-graph program compiles later in the background,
    so results never change with a compile's timing, and a warm-up (vLLM's worker)
    compiles every program that serving then runs."""
    expected = _generate(_weights("cpu"), 20)
    w = _weights("pjrt")
    torch.pjrt.synchronize()
    if how == "tiering off":
        monkeypatch.setattr(tiers, "enabled", False)
    torch.use_deterministic_algorithms(how == "deterministic")
    try:
        graph.forget()
        torch_pjrt.counters.reset()
        first = _generate(w, 20).cpu()
        compiles = torch_pjrt.metrics()["compiles"]
        torch_pjrt.wait_for_compiles()
        second = _generate(w, 20).cpu()
    finally:
        torch.use_deterministic_algorithms(False)
    m = torch_pjrt.metrics()
    assert m["graph_loops"] == 1 and "tiered_pieces" not in m
    assert torch.equal(first, expected) and torch.equal(second, first)
    assert m["compiles"] == compiles and "graph_loops_unrolling" not in m
    assert m.get("background_compiles_queued", 0) == 0


def test_a_device_check_raises_at_the_same_read(monkeypatch):
    x = torch.randn(8, 4).to("pjrt")
    bad = torch.tensor([1, 9]).to("pjrt")
    for on in (True, False):
        monkeypatch.setattr(tiers, "enabled", on)
        graph.forget()
        y = (x.exp() + 1)[bad].sum(0) * 2  # recorded: nothing raises yet
        with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 "
                                             "with size 8"):
            y.cpu()


def test_a_process_exits_cleanly_while_a_fused_program_compiles():
    code = (
        "import torch, torch_pjrt\n"
        "from torch_pjrt.eager import tiers\n"
        "tiers.PREFER_OPS = 1e9\n"
        "x = torch.randn(64, 64).to('pjrt')\n"
        "for _ in range(3):\n"
        "    y = x\n"
        "    for i in range(40):\n"
        "        y = (y @ x).tanh() * 0.5 + y.sin()\n"
        "    y.sum().item()\n"
        "from torch_pjrt.runtime import compile_pool\n"
        "assert compile_pool.pending() >= 1, compile_pool.pending()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_cut_goes_where_the_fewest_values_cross():
    # Ops a..h as one step, repeated 12 times after a prefix; each op reads the one before
    # (a: the previous step's h), and d reads that h too: one value crosses a step's
    # boundary, two cross any other cut (the chain and the step's input).
    class E:
        def __init__(self, name):
            self.name = name

    prefix = [E(f"p{i}") for i in range(5)]
    step = [E(c) for c in "abcdefgh"]
    wiring = []
    for e in prefix:
        wiring.append((e, ((len(wiring) - 1, 0),) if wiring else (0,), 0))
    for _ in range(12):
        start = len(wiring)
        for j, e in enumerate(step):
            refs = ((len(wiring) - 1, 0),) if j else ((start - 1, 0),)
            if j == 3:
                refs += ((start - 1, 0),)  # d also reads the step's input
            wiring.append((e, refs, 0))
    cuts = loops.cuts(tuple(wiring), [(len(wiring) - 1, 0)])
    assert cuts[0] == len(prefix) and all(b - a == 8 for a, b in zip(cuts, cuts[1:]))
    assert len(cuts) >= 11


def test_the_settings_and_their_defaults(monkeypatch):
    from torch_pjrt.runtime import compile_cache, compile_pool

    for name in ("TORCH_PJRT_TIERED", "TORCH_PJRT_FUSED_LOOPS", "TORCH_PJRT_QUICK_OPS",
                 "TORCH_PJRT_COMPILE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    tiers.configure()
    loops.configure()
    assert tiers.enabled and loops.enabled
    assert compile_cache.quick_options.__wrapped__() == {
        "xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
    assert compile_cache.quick_options.__wrapped__()["xla_backend_optimization_level"] == 0
    assert compile_pool.threads() >= 1
    monkeypatch.setenv("TORCH_PJRT_TIERED", "0")
    monkeypatch.setenv("TORCH_PJRT_FUSED_LOOPS", "0")
    monkeypatch.setenv("TORCH_PJRT_QUICK_OPS", "0")
    monkeypatch.setenv("TORCH_PJRT_COMPILE_THREADS", "3")
    tiers.configure()
    loops.configure()
    try:
        assert not tiers.enabled and not loops.enabled
        assert compile_cache.quick_options.__wrapped__() == {}
        assert compile_pool.threads() == 3
    finally:
        monkeypatch.undo()
        tiers.configure()
        loops.configure()


def test_attention_without_dropout_runs_op_by_op_on_its_quick_program():
    """SDPA takes an RNG key for its dropout; with dropout_p 0 (inference, a KV-cache
    decode step) it draws nothing, so op by op it runs on its quick program like any other
    op (a random op keeps its one program: its draws and what it computes from them must
    be the same bits in every program). HF's generate compiled one default-options
    attention program per decode step: 150-300 ms each."""
    from torch_pjrt.eager import op_cache

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 7, 24, generator=g) for _ in range(3))  # shapes of its own
    before = set(op_cache.cache)

    def attend(q, k, v):  # a graph of several ops (one alone runs its strict program)
        return F.scaled_dot_product_attention(q * 2, k, v, is_causal=True) + 1

    expected = attend(q, k, v)
    graph.forget()
    got = attend(*(t.to("pjrt") for t in (q, k, v)))
    torch.testing.assert_close(got.cpu(), expected)
    assert torch_pjrt.metrics()["tiered_ops"] >= 1
    torch.manual_seed(1)
    dropped = F.scaled_dot_product_attention(*(t.to("pjrt") for t in (q, k, v)),
                                             dropout_p=0.5).cpu()
    assert (dropped == 0).any() or dropped.abs().sum() > 0
    entries = [e for k, e in op_cache.cache.items()
               if k not in before and "fused_attention_overrideable." in e.name]
    drawing = [e for e in entries if e.draws]
    plain = [e for e in entries if not e.draws]
    assert plain and all(e.quick is not None and e.quick is not e.fn for e in plain)
    assert drawing and all(e.quick in (None, e.fn) for e in drawing)
