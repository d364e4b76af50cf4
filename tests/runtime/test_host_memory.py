"""On the cpu platform freed buffers are reused, not page-faulted in again on every run."""

import os
import subprocess
import sys

import pytest

_PROGRAM = r"""
import resource, torch, torch_pjrt
from torch_pjrt.runtime import client, host_memory
x = torch.ones(12 << 20, device="pjrt")  # 48 MB: over glibc's largest mmap threshold
def run():
    global y
    y = x * 2  # a fresh 48 MB output each time; the previous one dies
    torch.pjrt.synchronize()
for _ in range(20):  # the first runs map the memory that later runs reuse
    run()
per_run = []
for _ in range(3):  # the least of three batches: a loaded machine can delay a free
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        run()
    per_run.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
print(client.platform(), host_memory.tuned, min(per_run))
"""


def _faults_per_run(setting: str) -> tuple[str, bool, float]:
    env = {**os.environ, "TORCH_PJRT_HOST_MALLOC": setting}
    out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    return out[-3], out[-2] == "True", float(out[-1])


def test_large_outputs_reuse_their_pages():
    platform, tuned, faults = _faults_per_run("1")
    if platform != "cpu":
        pytest.skip("host malloc is tuned on the cpu platform only")
    assert tuned
    _, untuned, faults_off = _faults_per_run("0")
    assert not untuned
    pages = (48 << 20) // 4096
    assert faults_off > pages / 2  # every run maps and touches its output anew...
    assert faults < pages / 20  # ...unless freed memory is kept for reuse
