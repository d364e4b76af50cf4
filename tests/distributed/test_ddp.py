"""DistributedDataParallel on pjrt (2 processes, each half of the batch): losses and
parameters after SGD steps equal one CPU process running the global batch, with unused
parameters, small buckets, no_sync gradient accumulation, static_graph and under
torch.compile (DDP's graph breaks), in strict and fused eager modes."""

import launch
import pytest
import workers_ddp


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_ddp:run_all", nprocs=2, timeout=420)


@pytest.mark.parametrize("name", workers_ddp.NAMES)
def test_ddp_matches_the_global_batch(results, name):
    for rank, outcome in enumerate(results):
        assert outcome[name] == "ok", f"rank {rank}: {outcome[name]}"


def test_no_cpu_fallback(results):
    assert results[0]["cpu_fallbacks"] == "{}"
