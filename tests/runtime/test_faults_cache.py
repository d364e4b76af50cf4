"""Faults of the disk cache across processes: a program (strict ops, a fused graph, a
torch.compile step with its backward) runs on with correct results when every file of
the cache is damaged, when several processes start at once on an empty cache, after a
process was killed while compiling or while writing, and on a full or read-only file
system."""

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import pytest
import torch

PROGRAM = r"""
import json, os, signal, sys, warnings
import torch, torch_pjrt
from torch_pjrt.runtime import cache_files
warnings.simplefilter("always", cache_files.CacheWarning)  # each one the cache gives, shown

def killed_at(owner, name, when):
    # SIGKILL this process at a point of its work (a fault injected by the test)
    real = getattr(owner, name)
    def dying(*args, **kwargs):
        when(*args)
        return real(*args, **kwargs)
    setattr(owner, name, dying)

def half_then_die(fd, data, *rest):
    os.write(fd, data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

fault = os.environ.get("FAULT")
if fault == "kill-compiling":
    import jax
    killed_at(jax.stages.Lowered, "compile", lambda *a: os.kill(os.getpid(), signal.SIGKILL))
elif fault == "kill-writing":
    killed_at(cache_files, "_write_all", half_then_die)

x = torch.arange(12.0).reshape(3, 4) / 7
out = {}
with torch_pjrt.set_eager_mode("strict"):
    out["strict"] = (x.to("pjrt") * 2 + 1).softmax(-1).cpu().tolist()
with torch_pjrt.set_eager_mode("fused"):
    xd = x.to("pjrt")
    out["fused"] = ((xd.exp() - xd.mean()) / 3).sum(0).cpu().tolist()
    w = torch.linspace(-1, 1, 8).reshape(4, 2).to("pjrt").requires_grad_()
    step = torch.compile(lambda a, w: (a @ w).tanh().sum(), backend="pjrt")
    loss = step(xd, w)
    loss.backward()
    out["compiled"] = [loss.item(), w.grad.cpu().tolist()]
m = torch_pjrt.metrics()
print(json.dumps({"out": out, "metrics": {k: v for k, v in m.items() if isinstance(v, int)}}))
"""


def _expected():
    x = torch.arange(12.0).reshape(3, 4) / 7
    w = torch.linspace(-1, 1, 8).reshape(4, 2).requires_grad_()
    loss = (x @ w).tanh().sum()
    loss.backward()
    return {"strict": (x * 2 + 1).softmax(-1).tolist(),
            "fused": ((x.exp() - x.mean()) / 3).sum(0).tolist(),
            "compiled": [loss.item(), w.grad.tolist()]}


_INDUCTOR_DIR = []  # where PyTorch's own caches go (not on the file systems under test)


@pytest.fixture(scope="module", autouse=True)
def _inductor_dir(tmp_path_factory):
    _INDUCTOR_DIR[:] = [str(tmp_path_factory.mktemp("inductor"))]


def _env(cache_dir, **extra):
    return {**os.environ, "TORCH_PJRT_CACHE_DIR": str(cache_dir),
            "TORCHINDUCTOR_CACHE_DIR": _INDUCTOR_DIR[0], **extra}


def _start(cache_dir, **extra):
    return subprocess.Popen([sys.executable, "-c", PROGRAM], env=_env(cache_dir, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=300):
    """The program's results, metrics and the cache warnings it gave (one per kind)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    torch.testing.assert_close(result["out"], _expected())
    warned = [line for line in err.splitlines() if "CacheWarning" in line]
    return result["metrics"], warned


def _run(cache_dir, **extra):
    return _finish(_start(cache_dir, **extra))


def _files(cache_dir):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs)


def _damage(path, fault):
    if fault == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
    elif fault == "bit_flipped":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0x80]))
    elif fault == "emptied":
        os.truncate(path, 0)
    elif fault == "directory":
        os.remove(path)
        os.makedirs(os.path.join(path, "inside"))
    elif fault == "unreadable":  # (root reads it all the same)
        os.chmod(path, 0)


def test_every_file_of_the_cache_damaged(tmp_path):
    """Each program entry gets one of the faults in turn, the note of traced ops a flipped
    bit (bytes that are not UTF-8: it crashed every later op), the AOTAutograd entry is
    cut short. The next process computes the same results, warns once per kind of file,
    and rebuilds what it used: the one after it finds a healthy cache."""
    cold, warned = _run(tmp_path)
    assert cold["disk_cache_writes"] >= 4 and cold["aot_cache_writes"] == 1 and warned == []
    programs = [p for p in _files(tmp_path) if p.endswith(".xc")]
    faults = ["truncated", "bit_flipped", "emptied", "directory", "unreadable"]
    for i, path in enumerate(programs):
        _damage(path, faults[i % len(faults)])
    _damage(str(tmp_path / "xla" / "traced"), "bit_flipped")
    (aot,) = [p for p in _files(tmp_path) if p.endswith(".aot")]
    _damage(aot, "truncated")

    damaged, warned = _run(tmp_path)
    assert damaged["disk_cache_corrupt"] >= len(programs) - len(programs) // 5 - 1
    assert damaged["traced_note_corrupt"] == 1 and damaged["aot_cache_corrupt"] == 1
    assert len(warned) == 3, warned  # one per kind of file: programs, note, AOT entry

    healthy, warned = _run(tmp_path)
    assert warned == [] and healthy.get("disk_cache_misses", 0) == 0
    assert healthy["aot_cache_hits"] == 1


def test_processes_starting_at_once_on_an_empty_cache(tmp_path):
    procs = [_start(tmp_path) for _ in range(3)]
    for proc in procs:
        _, warned = _finish(proc)
        assert warned == []
    assert not [f for f in _files(tmp_path) if f.endswith(".tmp")]
    healthy, warned = _run(tmp_path)
    assert warned == [] and healthy.get("disk_cache_misses", 0) == 0


def test_processes_killed_while_compiling_and_while_writing(tmp_path):
    """SIGKILL in XLA's compile, then halfway through writing an entry: the next process
    is fine, and finds no half entry."""
    for fault in ("kill-compiling", "kill-writing"):
        proc = _start(tmp_path, FAULT=fault)
        proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, fault
    assert [f for f in _files(tmp_path) if f.endswith(".tmp")]  # what the killed one left
    metrics, warned = _run(tmp_path)
    assert warned == [] and metrics.get("disk_cache_corrupt", 0) == 0


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only): a real full, then read-only, file system."""
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        pytest.skip("mounting a tmpfs needs root (the write failure itself is tested in "
                    "test_faults_cache_files.py)")
    point = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    point.mkdir()
    made = subprocess.run([mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)],
                          capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


def test_full_then_read_only_file_system(tmpfs):
    metrics, warned = _run(tmpfs / "cache")
    assert metrics["disk_cache_write_errors"] == 1  # the first write that did not fit
    assert len(warned) == 1 and "cannot be written" in warned[0], warned
    assert not [f for f in _files(tmpfs) if f.endswith(".tmp")]
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True, timeout=30)
    metrics, warned = _run(tmpfs / "cache")
    assert metrics["disk_cache_hits"] > 0  # what fitted is read
    assert len(warned) == 1 and "cannot be written" in warned[0], warned
