"""Shipped caches: `python -m torch_pjrt precompile` fills one, `cache export` packs it,
`cache import` unpacks it on a machine of the same platform and versions, which then
starts with no compiles; a file made for other versions, or tampered with, is refused."""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from torch_pjrt.runtime import cache_bundle, compile_cache

# A compiled function first, then a training loop longer than precompile's auto stop.
SCRIPT = """
import sys
import torch, torch_pjrt

torch.manual_seed(0)
f = torch.compile(lambda a, b: (a @ b).relu().sum(-1), backend="pjrt")
print("compiled", f(torch.ones(3, 4).to("pjrt"), torch.ones(4, 5).to("pjrt")).tolist())
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                            torch.nn.Linear(32, 4)).to("pjrt")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(8, 16).to("pjrt"), torch.randint(0, 4, (8,)).to("pjrt")
for step in range(int(sys.argv[1])):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
m = torch_pjrt.metrics()
print("METRICS", json.dumps({k: m.get(k, 0) for k in (
    "disk_cache_misses", "disk_cache_hits", "aot_cache_hits", "xla_compiles", "disk_loads")}))
""".replace("import sys\n", "import json, sys\n", 1)


def _python(args, cache, timeout=600):
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(cache)}
    env.pop("TORCH_PJRT_METRICS", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A cache precompiled from SCRIPT (stopped by --steps auto) and exported."""
    tmp = tmp_path_factory.mktemp("ship")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    bundle = tmp / "cache.tar.gz"
    done = _python(["-m", "torch_pjrt", "precompile", "--export", str(bundle), str(script),
                    "6"], tmp / "made")
    assert done.returncode == 0, done.stderr[-3000:]
    return script, bundle, done.stderr


def _metrics(stdout):
    line = next(x for x in stdout.splitlines() if x.startswith("METRICS "))
    return json.loads(line[len("METRICS "):])


def test_precompiled_cache_runs_elsewhere_with_no_compiles(shipped, tmp_path):
    script, bundle, log = shipped
    assert "ran 3 optimizer steps" in log or "ran 2 optimizer steps" in log, log[-2000:]
    assert "loss" not in log  # stopped inside the loop, before its end
    imported = _python(["-m", "torch_pjrt", "cache", "import", str(bundle)], tmp_path / "new")
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert "entries added" in imported.stdout and "rejected" not in imported.stdout
    run = _python([str(script), "6"], tmp_path / "new")
    assert run.returncode == 0, run.stderr[-3000:]
    m = _metrics(run.stdout)
    assert m["xla_compiles"] == 0 and m["disk_cache_misses"] == 0, m
    assert m["disk_loads"] == m["disk_cache_hits"] > 0, m
    assert m["aot_cache_hits"] == 1, m  # torch.compile's graph skipped AOTAutograd too
    fresh = _python([str(script), "6"], tmp_path / "empty")  # the same run, nothing shipped
    assert _metrics(fresh.stdout)["disk_cache_misses"] == m["disk_cache_hits"]
    assert run.stdout.split("METRICS")[0] == fresh.stdout.split("METRICS")[0]  # same results


def _rewrite(bundle, out, edit):
    """A copy of `bundle` with edit(name, data) -> (name, data) or None (dropped) per member."""
    with tarfile.open(bundle, "r:*") as src, tarfile.open(out, "w") as dst:
        for member in src:
            changed = edit(member.name, src.extractfile(member).read())
            if changed is None:
                continue
            name, data = changed
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture
def target(tmp_path, monkeypatch):
    """An empty cache directory for imports made in this process."""
    folder = tmp_path / "target"
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(folder))
    return folder


def _files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, fs in os.walk(folder) for f in fs)


@pytest.mark.parametrize("part,value", [("jaxlib", "0.0.1"), ("kind", "TPU v9"),
                                        ("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")])
def test_a_cache_for_other_versions_is_refused_and_not_used(shipped, tmp_path, target,
                                                            part, value):
    _, bundle, _ = shipped

    def edit(name, data):
        if name == cache_bundle.MANIFEST:
            manifest = json.loads(data)
            manifest["key"][part] = value
            data = json.dumps(manifest).encode()
        return name, data

    bad = _rewrite(bundle, tmp_path / "bad.tar", edit)
    with pytest.raises(cache_bundle.Mismatch, match=f"{part}: the cache has '{value}'"):
        cache_bundle.import_(str(bad))
    assert _files(target) == []
    here = cache_bundle.key()
    assert here == {**compile_cache.platform_key(), "torch_pjrt": here["torch_pjrt"],
                    "python": here["python"]}


def test_damaged_foreign_and_escaping_files_are_rejected(shipped, tmp_path, target):
    _, bundle, _ = shipped
    programs = []

    def edit(name, data):
        if name.endswith(".xc") and not programs:
            programs.append(name)
            return name, data[:-1] + bytes([data[-1] ^ 1])  # one flipped bit
        return name, data

    flipped = _rewrite(bundle, tmp_path / "flipped.tar", edit)
    with tarfile.open(flipped, "a") as tar:  # and two files no cache holds
        for name in ("../escaped.xc", "xla/aa/notes.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    counts = cache_bundle.import_(str(flipped))
    reasons = "\n".join(counts["reasons"])
    assert counts["rejected"] == 3, reasons
    assert f"{programs[0]}: its checksum is not the manifest's" in reasons
    assert "../escaped.xc: not a file of the compile cache" in reasons
    assert not (tmp_path / "escaped.xc").exists() and programs[0] not in _files(target)
    assert counts["added"] > 0 and counts["notes"] > 0
    again = cache_bundle.import_(str(bundle))  # what was good is kept, the rest added
    assert again["rejected"] == 0 and again["present"] == counts["added"]
    assert again["added"] == 1 and again["notes"] == 0
    for path in _files(target):  # written as the cache writes its own: this user's alone
        assert os.stat(target / path).st_mode & 0o077 == 0


def test_a_file_that_is_not_a_cache_is_refused(tmp_path, target):
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        info = tarfile.TarInfo("xla/traced")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="not a torch-pjrt compile cache"):
        cache_bundle.import_(str(plain))
    assert _files(target) == []
