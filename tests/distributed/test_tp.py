"""DTensor tensor parallelism on pjrt, 2 processes: a transformer block under
parallelize_module (ColwiseParallel/RowwiseParallel, and with SequenceParallel norms),
eager in strict and fused modes and under torch.compile(backend="pjrt"); loss and every
gradient equal the same block in one CPU process."""

import launch
import pytest
import workers_tp


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_tp:run_all", nprocs=2, timeout=480)


@pytest.mark.parametrize("name", workers_tp.NAMES)
def test_tensor_parallel_block(results, name):
    for rank, outcome in enumerate(results):
        assert outcome[name] == "ok", f"rank {rank}: {outcome[name]}"


def test_no_cpu_fallback(results):
    assert results[0]["cpu_fallbacks"] == "{}"
