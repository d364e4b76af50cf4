"""Every collective of the `pjrt` process group on pjrt tensors, bit for bit against gloo on
the same values as CPU tensors, in strict, fused and debug eager modes (one 2-process job;
the checks are in workers_collectives.py)."""

import launch
import pytest
import workers_collectives


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_collectives:run_all", nprocs=2, timeout=420)


@pytest.mark.parametrize("name", workers_collectives.NAMES)
def test_collective(results, name):
    for rank, outcome in enumerate(results):
        assert outcome[name] == "ok", f"rank {rank}: {outcome[name]}"
