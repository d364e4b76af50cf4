"""Warm starts: AOTAutograd's results kept on disk (compile/warm.py) and found again, by
another process or after torch._dynamo.reset(); a damaged or mismatched entry compiles
afresh, never crashes and never gives another graph's result."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_as_accurate

import torch_pjrt

STEP = """
import json, sys
import torch, torch.nn.functional as F, torch_pjrt
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                            torch.nn.Linear(16, 4)).to("pjrt")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
compiled = torch.compile(model, backend="pjrt")
x, y = torch.randn(int(sys.argv[1]), 8).to("pjrt"), torch.randn(int(sys.argv[1]), 4).to("pjrt")
loss = F.mse_loss(compiled(x), y)
loss.backward()
opt.step()
if len(sys.argv) > 2:  # with TORCH_CACHING_PRECOMPILE=1: Dynamo's own cache is written now
    torch.compiler.save_cache_artifacts()
print(json.dumps({"loss": loss.item(),
                  "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
                  "metrics": {k: v for k, v in torch_pjrt.metrics().items()
                              if isinstance(v, int)}}))
"""


def _step(cache_dir, batch=8, precompile=False):
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(cache_dir),
           "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor")}
    args = [str(batch)]
    if precompile:
        env["TORCH_CACHING_PRECOMPILE"] = "1"
        args.append("save")
    out = subprocess.run([sys.executable, "-c", STEP, *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result, result.pop("metrics")


def _entries(cache_dir):
    return [os.path.join(d, f) for d, _, fs in os.walk(cache_dir / "aot") for f in fs
            if f.endswith(".aot")]


def test_second_process_skips_aotautograd(tmp_path):
    cold, m = _step(tmp_path)
    assert m["aot_cache_lookups"] == 1 and m["aot_cache_writes"] == 1
    assert m.get("aot_cache_hits", 0) == 0 and len(_entries(tmp_path)) == 1
    warm, m = _step(tmp_path)
    assert m["aot_cache_hits"] == 1 and m.get("aot_cache_writes", 0) == 0
    assert m["compiled_graphs"] == 2  # forward and backward, rebuilt from the entry
    assert m.get("disk_cache_misses", 0) == 0  # and their programs found on disk
    assert warm == cold  # the same programs: bit for bit


def test_damaged_entry_compiles_again(tmp_path):
    cold, _ = _step(tmp_path)
    (path,) = _entries(tmp_path)
    with open(path, "r+b") as f:  # flip bytes in the middle of the payload
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\xff" * 16)
    again, m = _step(tmp_path)
    assert m["aot_cache_corrupt"] == 1 and m.get("aot_cache_hits", 0) == 0
    assert m["aot_cache_writes"] == 1 and again == cold
    with open(_entries(tmp_path)[0], "r+b") as f:  # cut short
        f.truncate(100)
    again, m = _step(tmp_path)
    assert m["aot_cache_corrupt"] == 1 and m["aot_cache_writes"] == 1 and again == cold
    again, m = _step(tmp_path)
    assert m["aot_cache_hits"] == 1 and again == cold


def test_other_shape_is_another_entry(tmp_path):
    _step(tmp_path, batch=8)
    _, m = _step(tmp_path, batch=5)
    assert m.get("aot_cache_hits", 0) == 0 and m["aot_cache_writes"] == 1
    assert len(_entries(tmp_path)) == 2


def test_dynamo_precompile_opt_in_skips_tracing(tmp_path):
    """PyTorch's experimental Dynamo cache (TORCH_CACHING_PRECOMPILE=1, written by
    torch.compiler.save_cache_artifacts()) stores our entries too: the second process
    neither traces nor calls the backend."""
    cold, m = _step(tmp_path, precompile=True)
    assert m["aot_cache_writes"] == 1
    warm, m = _step(tmp_path, precompile=True)
    assert m.get("aot_cache_lookups", 0) == 0 and m["aot_cache_hits"] == 1
    assert m.get("disk_cache_misses", 0) == 0 and warm == cold


# ------------------------------------------------------------------ in one process
@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _fn(x, w):
    return F.gelu(x @ w).sum(-1)


def _run(x, w, **compile_kwargs):
    """_fn compiled afresh (Dynamo forgets its earlier graphs; the disk cache does not)."""
    torch._dynamo.reset()
    torch_pjrt.counters.reset()
    f = torch.compile(_fn, backend="pjrt", **compile_kwargs)
    out = f(x.to("pjrt"), w.to("pjrt"))
    if w.requires_grad:
        out.sum().backward()
    return out.detach().cpu(), torch_pjrt.metrics()


def _inputs(n=6, dtype=torch.float32, grad=True):
    torch.manual_seed(0)
    x = torch.randn(n, 8, dtype=dtype)
    w = torch.randn(8, 8, dtype=dtype).to("pjrt").requires_grad_(grad)
    return x, w


def _as_accurate(out, x, w):
    """The compiled result as accurate as the CPU's against float64 (tests/tolerance.py)."""
    w = w.detach().cpu()
    if x.dtype == torch.float64:  # no wider reference: float64's elementwise bound
        torch.testing.assert_close(out, _fn(x, w))
    else:
        assert_as_accurate(out, _fn(x, w), _fn(x.double(), w.double()))


def test_reset_then_same_graph_hits(cache_dir):
    x, w = _inputs()
    first, m = _run(x, w)
    assert m["aot_cache_writes"] == 1 and m.get("aot_cache_hits", 0) == 0
    grad = w.grad.cpu()
    w.grad = None
    again, m = _run(x, w)
    assert m["aot_cache_hits"] == 1 and m.get("aot_cache_writes", 0) == 0
    assert torch.equal(first, again) and torch.equal(grad, w.grad.cpu())
    _as_accurate(first, x, w)


@pytest.mark.parametrize("change", ["shape", "dtype", "no_grad", "matmul_precision",
                                    "cache_off"])
def test_changed_graph_or_setting_misses(cache_dir, change, monkeypatch):
    x, w = _inputs()
    _run(x, w)
    if change == "shape":
        x, w = _inputs(n=7)
    elif change == "dtype":
        x, w = _inputs(dtype=torch.float64)
    elif change == "no_grad":  # an inference graph, not a training one
        x, w = _inputs(grad=False)
    elif change == "matmul_precision":  # shapes our programs, not the graph
        monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    else:
        monkeypatch.setenv("TORCH_PJRT_COMPILE_CACHE", "0")
    out, m = _run(x, w)
    assert m.get("aot_cache_hits", 0) == 0
    assert m.get("aot_cache_writes", 0) == (0 if change == "cache_off" else 1)
    _as_accurate(out, x.to(w.dtype), w)


def test_dynamic_sizes_hit_with_guards(cache_dir):
    x, w = _inputs(n=6)
    _run(x, w, dynamic=True)
    for n in (6, 11):  # one symbolic graph serves both sizes
        x, w = _inputs(n=n)
        out, m = _run(x, w, dynamic=True)
        assert m["aot_cache_hits"] == 1, n
        _as_accurate(out, x, w)
