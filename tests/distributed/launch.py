"""Runs a test function in several processes, started as torchrun starts them.

`run("workers_basic:collectives", nprocs=2)` starts `python worker.py ...` once per rank
with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...),
calls `collectives()` in each and returns what each returned (JSON). A job that runs
past its timeout is killed (a hang fails fast) and every rank's output is shown.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the job's store and JAX's coordinator)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


class JobFailed(AssertionError):
    pass


def run(target: str, nprocs: int = 2, timeout: float = 120.0, env: dict | None = None,
        expect_failure: bool = False) -> list:
    """Each rank's return value of `target` ("module:function" in tests/distributed)."""
    port = free_port_pair()
    out_dir = tempfile.mkdtemp(prefix="pjrt-dist-")
    procs, logs = [], []
    for rank in range(nprocs):
        e = dict(os.environ)
        e.pop("XLA_FLAGS", None)  # one CPU device per process
        e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                  "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
                  "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": "0",
                  "PYTHONUNBUFFERED": "1"})
        e.update(env or {})
        log = open(os.path.join(out_dir, f"log{rank}.txt"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), target, out_dir],
            env=e, stdout=log, stderr=subprocess.STDOUT, cwd=HERE))
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    report = "\n".join(f"----- rank {r} (exit {p.returncode}) -----\n{_tail(o)}"
                       for r, (p, o) in enumerate(zip(procs, outputs)))
    if timed_out:
        raise JobFailed(f"{target}: the job ran past {timeout:g} s and was killed\n{report}")
    results = []
    for rank in range(nprocs):
        path = os.path.join(out_dir, f"result{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
        else:
            results.append(None)
    failed = any(p.returncode != 0 for p in procs) or None in results
    if failed and not expect_failure:
        raise JobFailed(f"{target}: a rank failed\n{report}")
    if expect_failure:
        return [(p.returncode, r, o) for p, r, o in zip(procs, results, outputs)]
    return results


def _tail(text: str, lines: int = 60) -> str:
    keep = [ln for ln in text.splitlines() if not ln.startswith(("I0000", "W0000"))]
    return "\n".join(keep[-lines:])
