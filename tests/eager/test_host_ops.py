"""Exact ops of a graph run op by op are computed on the host while they have no program
(eager/host_ops.py): NumPy's evaluation of an op's jaxpr equals XLA's bit for bit, only
exact steps qualify, and a decode loop whose cache grows by a token a step compiles no
program per length for its concatenations."""

import json
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import lax

import torch_pjrt
from torch_pjrt.eager import graph, host_ops, loops, tiers


def _both(f, *args):
    """f's results from XLA and from host_ops' NumPy evaluation of its jaxpr (its host
    program as a later process reads it from the cache: pickled and back)."""
    closed = jax.make_jaxpr(f)(*args)
    prog = host_ops.program(closed)
    assert prog is not None, closed
    prog = pickle.loads(pickle.dumps(prog))
    with np.errstate(all="ignore"):
        host = host_ops.evaluate(prog, [np.asarray(a) for a in args])
    xla = jax.tree.leaves(jax.jit(f)(*args))
    return host, [np.asarray(x) for x in xla]


_I8 = np.array([[120, -128, 7], [-5, 127, 0]], np.int8)
_I64 = np.arange(24, dtype=np.int64).reshape(2, 3, 4) * 1_000_000_007
_F32 = np.array([[1.5, np.nan, -0.0], [np.inf, -2.25, 3e-39]], np.float32)

EXACT_CASES = {
    "concatenate": (lambda a, b: jnp.concatenate([a, b, a], 1), _F32, _F32[:, :2]),
    "slice, strided": (lambda a: a[1:, ::2, 3:0:-1], _I64),
    "pad: interior, negative low": (
        lambda a: lax.pad(a, jnp.int64(-9), [(-1, 2, 0), (1, -1, 2), (0, 0, 1)]), _I64),
    "dynamic_slice clamps its start": (
        lambda a, i: lax.dynamic_slice(a, (i, i, i), (2, 2, 3)), _I64, np.int32(7)),
    "dynamic_update_slice clamps its start": (
        lambda a, u, i: lax.dynamic_update_slice(a, u, (i, -i)), _F32, _F32[:1, :2],
        np.int64(5)),
    "select_n of floats by an integer comparison": (
        lambda a, b, i: jnp.where(i > 0, a, b), _F32, _F32[::-1], _I8[:, :3]),
    "integer comparisons": (
        lambda a, b: (a == b, a != b, a < b, a >= b), _I8, _I8[::-1]),
    "integer arithmetic wraps": (
        lambda a, b: (a + b, a * b, a - b, -a, jnp.maximum(a, b), a & b, a ^ b, ~a),
        _I8, _I8[::-1]),
    "integer conversions wrap": (
        lambda a: (a.astype(jnp.int8), a.astype(jnp.uint16), a.astype(bool),
                   (a > 5).astype(jnp.int32)), _I64),
    "cumsum, both ways": (
        lambda a: (jnp.cumsum(a, 1), lax.cumsum(a, 2, reverse=True)), _I64),
    "iota and broadcast": (
        lambda a: jnp.arange(4, dtype=jnp.int64)[None, :] + jnp.broadcast_to(a[:, :1], (3, 4)),
        _I64[0]),
    "integer reductions": (
        lambda a, b: (jnp.sum(a, (0, 2)), jnp.max(b, 1), jnp.min(a, 0), jnp.argmax(b, 1),
                      jnp.any(b > 3, 0), jnp.all(b > -100, 1)),
        _I64, np.array([[1, 9, 9, -3], [4, 4, 0, 2]], np.int8)),
    "float to integer, in range (truncating)": (
        lambda a: (a.astype(jnp.int32), a.astype(jnp.uint8)),
        np.array([[1.5, -0.0, 0.0], [3e-39, 254.9, 7.99]], np.float32)),
    "integers to floats that hold them (a pad or fill value)": (
        lambda a, b: (a.astype(jnp.float32), a.astype(jnp.float16), a.astype(jnp.bfloat16),
                      b.astype(jnp.float32), a.astype(jnp.float64)),
        np.array([[0, -7, 256], [255, -256, 1]], np.int64), np.array([True, False])),
    "copy": (lambda a: jnp.copy(a) + 1, _I64),
    "transpose, rev, squeeze": (
        lambda a: (jnp.transpose(a, (2, 0, 1)), jnp.flip(a, (0, 2)), a[:1, :, :1].squeeze()),
        _I64),
}


@pytest.mark.parametrize("case", sorted(EXACT_CASES))
def test_numpy_evaluates_exact_steps_as_xla_does(case):
    f, *args = EXACT_CASES[case]
    host, xla = _both(f, *args)
    assert len(host) == len(xla)
    for h, x in zip(host, xla):
        assert h.dtype == x.dtype and h.shape == x.shape
        assert h.tobytes() == x.tobytes()  # bit for bit (NaN payloads and -0 included)


@pytest.mark.parametrize("f, args", [
    (lambda a: a + a, (_F32,)),  # rounding: the compiler's
    (lambda a, b: a // b, (_I8, _I8)),  # division: rounding, and by zero
    (lambda a: a >> 2, (_I8,)),  # shifts: out-of-range counts
    (lambda a: jnp.sum(a), (_F32,)),  # a float reduction: the compiler's order
    (lambda a: jnp.max(a, 0), (_I64[:, :0],)),  # an empty reduction
    (lambda a: a.astype(jnp.float32) * 2, (np.array([True, False]),)),
])
def test_inexact_or_unlisted_steps_keep_their_program(f, args):
    assert not host_ops._exact(jax.make_jaxpr(f)(*args).jaxpr)


@pytest.mark.parametrize("value", [np.nan, np.inf, -1.0, 256.0])
def test_a_float_an_integer_type_cannot_hold_is_not_converted_on_the_host(value):
    closed = jax.make_jaxpr(lambda a: a.astype(jnp.uint8))(np.zeros(3, np.float32))
    assert host_ops._exact(closed.jaxpr)  # checked as it runs: C leaves these undefined
    with pytest.raises(host_ops.NotExact):
        host_ops.evaluate(host_ops.program(closed), [np.array([1.0, value, 2.0], np.float32)])


@pytest.mark.parametrize("dtype, value", [(jnp.float32, 2 ** 24 + 1), (jnp.float32, -(2 ** 31)),
                                          (jnp.bfloat16, 257), (jnp.float16, 4097)])
def test_an_integer_a_float_cannot_hold_is_not_converted_on_the_host(dtype, value):
    """Integer to float is exact where the float holds the value (checked as it runs);
    a value it would round is left to the program (the rounding is the compiler's)."""
    closed = jax.make_jaxpr(lambda a: a.astype(dtype))(np.zeros(3, np.int64))
    assert host_ops._exact(closed.jaxpr)
    with pytest.raises(host_ops.NotExact):
        host_ops.evaluate(host_ops.program(closed), [np.array([1, value, 2], np.int64)])


@pytest.fixture
def _op_by_op(monkeypatch):
    torch_pjrt.ensure_initialized()
    monkeypatch.setenv("TORCH_PJRT_COMPILE_CACHE", "0")
    monkeypatch.setattr(tiers, "PREFER_OPS", 1e9)  # op by op wherever a graph may
    monkeypatch.setattr(tiers, "enabled", True)
    monkeypatch.setattr(loops, "enabled", True)
    torch_pjrt.wait_for_compiles()  # (an earlier test's, counted otherwise)
    with torch_pjrt.set_eager_mode("fused"):
        yield
    torch_pjrt.wait_for_compiles()


def _decode(device, steps: int, prompt: int = 3):
    """A dynamic-cache decode loop as transformers' generate() runs it: the cache, the
    attention mask and the tokens grow by one a step, and each step reads a value back."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 8, generator=g).to(device)
    tokens = torch.arange(prompt, device=device)[None] % 7
    mask = torch.ones_like(tokens)
    cache = w[tokens[0]]
    for _ in range(steps):
        position = mask.long().cumsum(-1) - 1  # integer bookkeeping, one length a step
        x = w[tokens[0, -1:]] + position[0, -1:].float()[:, None] / 8
        cache = torch.cat([cache, x])
        scores = (cache @ x.T).softmax(0)
        token = ((scores * cache).sum(0) @ w.T).argmax()[None, None]
        tokens = torch.cat([tokens, token], -1)
        mask = torch.cat([mask, torch.ones_like(token)], -1)
        if tokens.max().item() < 0:  # generate()'s stopping check: a read each step
            break
    return tokens.cpu(), cache.cpu()


def test_a_growing_cache_compiles_no_program_per_length(_op_by_op, monkeypatch):
    # the host off first, on other lengths: what every length shares compiles here
    with monkeypatch.context() as off:
        off.setattr(host_ops, "MAX_BYTES", 0)
        expected = _decode("cpu", 12, prompt=30)
        torch_pjrt.counters.reset()
        assert torch.equal(_decode("pjrt", 12, prompt=30)[0], expected[0])
        torch_pjrt.wait_for_compiles()
        without = torch_pjrt.metrics()["xla_compiles"]
    expected = _decode("cpu", 12)
    graph.forget()
    torch_pjrt.counters.reset()
    got = _decode("pjrt", 12)
    torch_pjrt.wait_for_compiles()
    m = torch_pjrt.metrics()
    assert torch.equal(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    # every step's concatenations, cumsum, max and slices of a new length ran on the host;
    # what still compiles a program per length is the float math (mm, softmax, mul, sum),
    # the gather and the int-to-float conversion
    assert m["host_ops"] >= 12 * 4
    assert m["xla_compiles"] <= 12 * 6 + 6
    assert without >= m["xla_compiles"] + 12 * 3


def test_an_op_wanted_again_in_a_later_flush_gets_its_program(_op_by_op):
    # shapes and a dtype no other test uses: pytest-xdist may have run another file's
    # tests in this process first, and an op with its program already compiled there
    # would not run on the host here
    a = torch.arange(26, dtype=torch.int16, device="pjrt").reshape(2, 13)
    b = torch.arange(26, dtype=torch.int16, device="pjrt").reshape(13, 2).T
    expected = torch.cat([a.cpu(), b.cpu()], 1).T
    graph.forget()
    torch_pjrt.counters.reset()
    counts = []
    for _ in range(3):
        c = torch.cat([a, b], 1).T.contiguous()  # two ops: the graph runs op by op
        assert torch.equal(c.cpu(), expected)
        m = torch_pjrt.metrics()
        counts.append((m.get("host_ops", 0), m.get("xla_compiles", 0)))
    # the first flush on the host; the second compiles the ops' programs and runs them
    assert counts[0] == (2, 0)
    assert counts[1][0] == counts[2][0] == 2 and counts[1][1] >= 2


_WARM = """
import json, sys, torch, torch_pjrt
from torch_pjrt.eager import loops, tiers
sys.path.insert(0, sys.argv[1])
import test_host_ops as t
torch_pjrt.ensure_initialized()
tiers.PREFER_OPS, tiers.enabled, loops.enabled = 1e9, True, True
torch_pjrt.set_eager_mode("fused")
tokens, cache = t._decode("pjrt", 6)
m = torch_pjrt.metrics()
print("RESULT " + json.dumps([tokens.tolist(), cache.tolist(), m.get("host_ops", 0),
                              m.get("host_records_used", 0)]))
"""


def test_a_warm_process_runs_the_host_programs_an_earlier_one_recorded(tmp_path):
    """The first process traces each op it runs on the host and records its host program
    (runtime/warm_start.HOST); the next one, which traces nothing where it records ops,
    runs those records: the same results, no op traced for the host."""
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _WARM, os.path.dirname(__file__)],
                              env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        runs.append(json.loads(line[len("RESULT "):]))
    tokens, cache = _decode("cpu", 6)
    for got_tokens, got_cache, host, _ in runs:
        assert got_tokens == tokens.tolist() and host > 0
        assert torch.allclose(torch.tensor(got_cache), cache)
    assert runs[0][3] == 0 and runs[1][3] > 0


def test_large_operands_keep_their_program(_op_by_op, monkeypatch):
    monkeypatch.setattr(host_ops, "MAX_BYTES", 64)
    graph.forget()
    torch_pjrt.counters.reset()
    a = torch.arange(100, device="pjrt")
    assert torch.equal(torch.cat([a, a]).cpu(), torch.cat([torch.arange(100)] * 2))
    assert torch_pjrt.metrics().get("host_ops", 0) == 0


def test_a_loop_within_one_flush_gets_its_programs_after_a_few_steps(_op_by_op,
                                                                    monkeypatch):
    """A static-cache loop records every step into one flush: its exact ops (the position
    bookkeeping, the token's concatenation) recur within it and get their programs once
    their runs on the host have cost BUDGET seconds, instead of waiting for their operands
    every step."""
    monkeypatch.setattr(host_ops, "BUDGET", 1e-9)  # one run each
    def loop(device):
        w = torch.arange(64, device=device).reshape(8, 8) % 5
        pos = torch.zeros(1, dtype=torch.long, device=device)
        cache = torch.zeros(8, 8, dtype=torch.long, device=device)
        for _ in range(30):
            cache.index_copy_(0, pos % 8, w[pos % 8] + pos)
            pos = torch.cat([pos + 1, pos])[:1]  # exact: cat, add, slice
        return cache.cpu()

    expected = loop("cpu")
    graph.forget()
    torch_pjrt.counters.reset()
    assert torch.equal(loop("pjrt"), expected)
    m = torch_pjrt.metrics()
    assert m["flushes"] == 1 and m["tiered_ops"] >= 30 * 3
    assert 1 <= m["host_ops"] <= 12  # its ten distinct exact ops, once each (not 90)


_I = torch.tensor([[5, -3, 0, 7, 7], [-128, 127, 2, 2, -1], [9, 0, -9, 4, 3]])
_F = torch.tensor([[1.5, float("nan"), -0.0, 2.0, 3e-39], [float("inf"), -1.0, 0.5, 7.0, -2.5],
                   [0.0, 1.0, 2.0, 3.0, 4.0]])
# PyTorch ops whose lowerings are exact (integer math, comparisons, data movement of any
# dtype): each is computed on the host in fused mode and by its program in strict mode
TORCH_EXACT = {
    "cumsum": lambda i, f: i.cumsum(1),
    "cat and slice": lambda i, f: torch.cat([i, i[:, :2]], 1)[1:],
    "float cat, flip, transpose": lambda i, f: torch.cat([f, f.flip(0)]).T.contiguous(),
    "masked_fill of floats by an int mask": lambda i, f: f.masked_fill(i > 2, -1.25),
    "where, ints": lambda i, f: torch.where(i % 2 == 0, i, -i),
    "triu, tril": lambda i, f: (i.triu(1), f.tril(-1)),
    "int8 wrap": lambda i, f: (i.to(torch.int8) * 3 + 100).to(torch.int16),
    "uint8 wrap": lambda i, f: i.to(torch.uint8) - 7,
    "bitwise": lambda i, f: (i & 6) ^ (i | 1) ^ ~i,
    "clamp, max, min": lambda i, f: (i.clamp(-4, 5), i.max(1).values, i.amin(0)),
    "argmax ints": lambda i, f: i.argmax(1),
    "sum and any of ints": lambda i, f: (i.sum(0), (i > 4).any(1), (i != 0).all(0)),
    "roll and repeat": lambda i, f: (i.roll(2, 1), f.repeat(2, 1)),
    "constant pad": lambda i, f: torch.nn.functional.pad(i, (1, 2, 0, 1), value=-5),
    "expand and narrow": lambda i, f: f[:, :1].expand(3, 4).contiguous().narrow(1, 1, 2),
    "arange and eq": lambda i, f: torch.arange(5, device=i.device) == i[0],
    "bool logic": lambda i, f: (i > 0) & ~(i < 5) | (i == 7),
    # the float -> int cast of NaN, inf, 1e30: not on the host (XLA saturates), the program
    "float to int, out of range": lambda i, f: (  # (twice: its program from then on)
        (f * 1e30).to(torch.int32) + i.to(torch.int32), (f * -1e30).to(torch.int32)),
}


@pytest.mark.parametrize("case", sorted(TORCH_EXACT))
def test_exact_torch_ops_on_the_host_equal_their_programs(case, _op_by_op, monkeypatch):
    f = TORCH_EXACT[case]
    on_host = []
    run_on_host = host_ops.run

    def noted(entry, *args):
        on_host.append(entry.name)
        return run_on_host(entry, *args)

    monkeypatch.setattr(host_ops, "run", noted)

    def run(device):
        out = f(_I.to(device), _F.to(device))
        out = out if isinstance(out, tuple) else (out,)
        return [o.clone().cpu() for o in out]  # (a graph of one op runs as a program)

    expected = run("cpu")
    graph.forget()
    torch_pjrt.counters.reset()
    fused = run("pjrt")  # fresh signatures, op by op: on the host
    assert set(on_host) - {"aten.clone.default"} or case in (
        "expand and narrow", "float to int, out of range"), on_host
    with torch_pjrt.set_eager_mode("strict"):
        strict = run("pjrt")  # the same signatures' own programs
    def bits(t):  # bit for bit, NaN and -0 included
        return t.contiguous().view(torch.uint8) if t.dtype.is_floating_point else t

    for e, h, s in zip(expected, fused, strict):
        assert e.dtype == h.dtype == s.dtype and e.shape == h.shape == s.shape
        assert torch.equal(bits(h), bits(s)), (case, h, s)
        if case != "float to int, out of range":  # (undefined in C: x86 gives INT_MIN)
            assert torch.equal(bits(h), bits(e)), (case, h, e)
