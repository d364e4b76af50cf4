"""The persistent compile cache: warm processes reuse programs; damage never crashes."""

import os
import subprocess
import sys

import pytest

PROGRAM = """
import torch, torch_pjrt
torch_pjrt.set_eager_mode("{mode}")
x = torch.arange(12.0).reshape(3, 4).to("pjrt")
y = (x * 2 + 1).softmax(-1)[torch.tensor([2, 0]).to("pjrt")]
assert torch.allclose(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2 + 1).softmax(-1)[[2, 0]])
try:
    x[torch.tensor([5]).to("pjrt")].cpu()
    raise SystemExit("no IndexError")
except IndexError:
    pass
torch_pjrt.wait_for_compiles()  # (at exit, queued background compiles are dropped, unstored)
m = torch_pjrt.metrics()
print("hits", m.get("disk_cache_hits", 0), "misses", m.get("disk_cache_misses", 0),
      "compiles", m.get("xla_compiles", 0),
      "corrupt", m.get("disk_cache_corrupt", 0), "evictions", m.get("disk_cache_evictions", 0))
"""


def _run(cache_dir, mode="strict", extra_env=None, background=False):
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(cache_dir), **(extra_env or {})}
    cmd = [sys.executable, "-c", PROGRAM.format(mode=mode)]
    if background:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return _counts(out.stdout)


def _counts(stdout):
    words = stdout.split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}


def _entries(cache_dir):
    return [os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs
            if f.endswith(".xc")]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_second_process_starts_warm(tmp_path, mode):
    cold = _run(tmp_path, mode)
    assert cold["misses"] > 0 and cold["hits"] == 0
    warm = _run(tmp_path, mode)
    assert warm["compiles"] == 0 and cold["compiles"] > 0
    if mode == "strict":
        assert warm["hits"] == cold["misses"] and warm["misses"] == 0
    else:  # a flush looks for its graph's fused program first: the cold process ran the
        # graph op by op, so that lookup misses, and the op programs are loaded instead
        assert 0 < warm["hits"] <= cold["misses"]


def test_compiler_flags_from_the_environment_are_part_of_the_key(tmp_path):
    """A program XLA built under other XLA_FLAGS is another program (fast math, precision):
    it must not be served to a process with different flags."""
    flags = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
    first = _run(tmp_path, extra_env=flags)
    assert first["misses"] > 0
    other = _run(tmp_path, extra_env={"XLA_FLAGS": ""})
    assert other["hits"] == 0 and other["misses"] == first["misses"]
    again = _run(tmp_path, extra_env=flags)
    assert again["misses"] == 0 and again["hits"] == first["misses"]


def test_two_processes_at_once(tmp_path):
    procs = [_run(tmp_path, background=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    assert _run(tmp_path)["misses"] == 0


def test_corrupt_and_truncated_entries_are_recompiled(tmp_path):
    _run(tmp_path)
    entries = _entries(tmp_path)
    with open(entries[0], "r+b") as f:  # flip bytes in the middle
        f.seek(100)
        f.write(b"garbage!garbage!")
    with open(entries[1], "r+b") as f:  # cut short, as if the writer was killed
        f.truncate(50)
    counts = _run(tmp_path)
    assert counts["corrupt"] == 2 and counts["misses"] >= 2
    assert _run(tmp_path)["misses"] == 0  # rewritten and healthy again


def test_size_limit_evicts_least_recently_used(tmp_path):
    counts = _run(tmp_path, extra_env={"TORCH_PJRT_CACHE_MAX_BYTES": "20000"})
    assert counts["evictions"] > 0
    total = sum(os.path.getsize(p) for p in _entries(tmp_path))
    assert total <= 20000


def test_cache_cli_info_and_clear(tmp_path):
    _run(tmp_path)
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    info = subprocess.run([sys.executable, "-m", "torch_pjrt", "cache", "info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0 and "aot entries" in info.stdout, info.stderr
    aot = tmp_path / "aot" / "ab" / "x.aot"  # an entry of the torch.compile cache
    aot.parent.mkdir(parents=True)
    aot.write_bytes(b"entry")
    clear = subprocess.run([sys.executable, "-m", "torch_pjrt", "cache", "clear"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert clear.returncode == 0, clear.stderr
    assert _entries(tmp_path) == [] and not aot.exists()


LINALG = """
import torch, torch_pjrt
a = torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]], dtype=torch.float64)
w = torch.linalg.eigvalsh(a.to("pjrt")).cpu()
s = torch.linalg.svdvals(a.to("pjrt")).cpu()
assert torch.allclose(w, torch.linalg.eigvalsh(a)) and torch.allclose(s, torch.linalg.svdvals(a))
print("hits", torch_pjrt.metrics().get("disk_cache_hits", 0))
"""


def test_programs_with_lapack_calls_run_from_disk(tmp_path):
    """A warm process never lowers: the LAPACK custom calls must still be set up (they
    called through null pointers, a segfault, before)."""
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    for run in ("cold", "warm"):
        out = subprocess.run([sys.executable, "-c", LINALG], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, f"{run}: rc {out.returncode}: {out.stderr[-2000:]}"
    assert _counts(out.stdout)["hits"] > 0


TRACES = """
import jax, torch, torch_pjrt
calls = [0]
make_jaxpr = jax.make_jaxpr
def counting(*a, **k):
    calls[0] += 1
    return make_jaxpr(*a, **k)
jax.make_jaxpr = counting
torch_pjrt.set_eager_mode("fused")
x = torch.arange(12.0).reshape(3, 4).to("pjrt")
y = ((x * 2 + 1).softmax(-1) - x.sum()).cpu()
print("traces", calls[0])
"""


def test_fused_eager_traces_each_signature_once_across_processes(tmp_path):
    """Fused eager traces a new op signature where it is recorded (its errors are the
    op's); a warm process knows from the cache which ones traced cleanly and skips them."""
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    counts = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", TRACES], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        counts.append(_counts(out.stdout)["traces"])
    assert counts[0] >= 4 and counts[1] == 0, counts
    subprocess.run([sys.executable, "-m", "torch_pjrt", "cache", "clear"], env=env,
                   capture_output=True, timeout=120, check=True)
    assert not (tmp_path / "xla" / "traced").exists()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_process_lets_go_of_its_oldest_programs_past_the_limit(monkeypatch, mode):
    """Each XLA:CPU program holds ~9 memory mappings: a process that kept every program
    crashed inside XLA once it passed vm.max_map_count (a test-suite worker did). Past the
    limit the oldest programs are let go, and come back from the cache when used again."""
    import torch

    import torch_pjrt
    from torch_pjrt import metrics
    from torch_pjrt.runtime import compile_cache

    monkeypatch.setattr(compile_cache, "max_live", lambda: 8)
    before = metrics().get("programs_let_go", 0)
    with torch_pjrt.set_eager_mode(mode):
        x = torch.arange(6.0, device="pjrt")
        for rounds in range(2):  # the second round reuses programs let go in the first
            for k in range(12):  # a program per size
                got = (x[: k % 6 + 1] * (k + 2) + 1.5 * rounds).sum().item()
                want = float((torch.arange(k % 6 + 1.0) * (k + 2) + 1.5 * rounds).sum())
                assert got == want
    assert metrics().get("programs_let_go", 0) > before


def test_a_process_near_its_memory_mapping_limit_lets_go_of_programs(monkeypatch):
    """Programs of many kernels map more than the count limit assumes (a PyTorch test-file
    worker died in LLVM, "Cannot allocate memory", under it): the process's mappings are
    counted every few programs, and past half of vm.max_map_count the oldest go too."""
    import torch

    import torch_pjrt
    from torch_pjrt import metrics
    from torch_pjrt.runtime import compile_cache

    monkeypatch.setattr(compile_cache, "max_live", lambda: 1 << 30)
    monkeypatch.setattr(compile_cache, "max_map_count", lambda: 65530)
    monkeypatch.setattr(compile_cache, "map_count", lambda: 40000)
    monkeypatch.setattr(compile_cache, "_MAP_CHECK_EVERY", 2)
    before = metrics().get("programs_let_go", 0)
    with torch_pjrt.set_eager_mode("strict"):
        x = torch.arange(6.0, device="pjrt")
        for k in range(8):  # a program per size
            assert (x[: k % 6 + 1] * (k + 3)).sum().item() == float(
                (torch.arange(k % 6 + 1.0) * (k + 3)).sum())
    assert metrics().get("programs_let_go", 0) > before


def test_the_mapping_count_is_read_from_proc():
    from torch_pjrt.runtime import compile_cache

    count = compile_cache.map_count()
    assert count is None or count > 100  # a Python process with torch maps hundreds


def test_jaxs_staging_caches_are_let_go_and_programs_keep_running(monkeypatch):
    """JAX keeps ~1.5 MB of staging per compiled program (jaxpr, module, call caches) while
    the jitted function lives: compile_cache clears them every _CLEAR_EVERY programs. The
    programs pjrt holds keep running, and those it let go come back, with their values."""
    import torch

    import torch_pjrt
    from torch_pjrt import metrics
    from torch_pjrt.runtime import compile_cache

    monkeypatch.setattr(compile_cache, "_CLEAR_EVERY", 4)
    before = metrics().get("jax_caches_cleared", 0)
    with torch_pjrt.set_eager_mode("strict"):
        for rounds in range(2):
            for k in range(1, 10):  # a program per size
                x = torch.arange(float(k), device="pjrt")
                got = (x * (rounds + 2) + 1).sum().item()
                assert got == float((torch.arange(float(k)) * (rounds + 2) + 1).sum())
    assert metrics().get("jax_caches_cleared", 0) > before


UNREAD = """
import torch, torch_pjrt
torch_pjrt.set_eager_mode("fused")
x = torch.arange(4.0, device="pjrt")
for alone in (True, False):
    if not alone:
        y = x * 2  # read below: the checked op is one of a graph of several
    x[torch.tensor([7], device="pjrt")]  # nothing reads the result
    try:
        torch.pjrt.synchronize()
        raise SystemExit(f"no IndexError (alone={alone})")
    except IndexError:
        pass
    if not alone:
        assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
print("hits", torch_pjrt.metrics().get("disk_cache_hits", 0))
"""


def test_a_warm_process_still_checks_results_nobody_reads(tmp_path):
    """Fused eager keeps an op that checks data when nothing reads its result. A warm
    process, which traces nothing, learns that from the note of traced ops (it dropped the
    out-of-range index, silently, when only tracing told it)."""
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    for run in ("cold", "warm"):
        out = subprocess.run([sys.executable, "-c", UNREAD], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, (run, out.stderr[-2000:])
    assert _counts(out.stdout)["hits"] > 0


def test_an_edited_register_jax_kernel_gets_new_programs(tmp_path, monkeypatch):
    # a kernel's code lives outside torch-pjrt: its file's hash joins the programs' key, so
    # that an edited kernel (a plugin upgraded in place) never reuses a stale program
    import importlib.util

    import torch_pjrt  # noqa: F401 - the runtime
    from torch_pjrt.runtime import compile_cache

    def load(body: str):
        path = tmp_path / "my_kernel.py"
        path.write_text(f"def kernel(x):\n    return {body}\n")
        spec = importlib.util.spec_from_file_location("my_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.kernel

    monkeypatch.setattr(compile_cache, "_kernel_sources", dict(compile_cache._kernel_sources))
    compile_cache.note_kernel_source(load("x * 2"))
    first = compile_cache.digest(("a program",), 0)
    compile_cache.note_kernel_source(load("x * 2"))
    assert compile_cache.digest(("a program",), 0) == first  # the same code: the same key
    compile_cache.note_kernel_source(load("x * 3"))
    assert compile_cache.digest(("a program",), 0) != first
    monkeypatch.undo()
    compile_cache._prefix.cache_clear()  # the process's own kernels again


VALUES = """
import sys, torch, torch_pjrt
torch_pjrt.set_eager_mode("{mode}")
torch.manual_seed(0)
x = torch.linspace(-6, 6, 4099).to("pjrt")
y = torch.linspace(0.01, 9, 4099).to("pjrt")
outs = [x.exp(), x.tanh(), torch.erf(x), x.sin(), x.sigmoid(), y.log(), y.rsqrt(),
        y.pow(2.7), x.softmax(0), torch.nn.functional.gelu(x), (x * 3 + y).cumsum(0),
        x.reshape(-1, 1)[:4096].reshape(64, 64) @ y[:4096].reshape(64, 64),
        torch.rand(4099, device="pjrt"), torch.randn(4099, device="pjrt")]
torch.save([o.cpu() for o in outs], sys.argv[1])
"""


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_the_llvm_opt_level_changes_no_value_and_keys_the_cache(tmp_path, mode):
    """XLA:CPU programs are compiled at LLVM level 2 (compile_cache.default_options), not
    XLA's 3: the same bits, random numbers included, and a program built at one level is
    never served to a process asking for the other."""
    import torch

    results = {}
    for level in ("3", "2"):
        env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path / "cache"),
               "TORCH_PJRT_XLA_CPU_OPT_LEVEL": level}
        out = subprocess.run([sys.executable, "-c", VALUES.format(mode=mode),
                              str(tmp_path / f"{level}.pt")],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        results[level] = torch.load(tmp_path / f"{level}.pt")
    for slow, quick in zip(results["3"], results["2"]):
        assert torch.equal(slow, quick)
    first = _run(tmp_path / "keyed", mode, {"TORCH_PJRT_XLA_CPU_OPT_LEVEL": "3"})
    other = _run(tmp_path / "keyed", mode, {"TORCH_PJRT_XLA_CPU_OPT_LEVEL": "2"})
    assert first["compiles"] > 0 and other["hits"] == 0 and other["compiles"] > 0


def test_xla_cpu_programs_compile_at_llvm_level_2_by_default(monkeypatch):
    from torch_pjrt.runtime import compile_cache

    monkeypatch.delenv("TORCH_PJRT_XLA_CPU_OPT_LEVEL", raising=False)
    assert compile_cache.default_options.__wrapped__() == {"xla_backend_optimization_level": 2}
    assert compile_cache.platform_key()["opt_level"] == "2"
    monkeypatch.setenv("TORCH_PJRT_XLA_CPU_OPT_LEVEL", "3")
    assert compile_cache.default_options.__wrapped__() == {}
