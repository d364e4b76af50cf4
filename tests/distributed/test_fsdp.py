"""FSDP2 (fully_shard) on pjrt, 2 processes: losses and gathered parameters after Adam
steps equal one CPU process on the global batch (float32: resharding after forward or
not, a gradient divide factor that makes the reduce-scatter PREMUL_SUM, CPU offload,
under torch.compile), and equal FSDP2 on CPU tensors over gloo with bfloat16 parameters
and float32 reduction; in strict and fused eager modes. FSDP2 frees and re-allocates its
unsharded parameters with untyped_storage().resize_() and calls record_stream."""

import launch
import pytest
import workers_fsdp


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_fsdp:run_all", nprocs=2, timeout=600)


@pytest.mark.parametrize("name", workers_fsdp.NAMES)
def test_fsdp2(results, name):
    for rank, outcome in enumerate(results):
        assert outcome[name] == "ok", f"rank {rank}: {outcome[name]}"


def test_reduce_scatter_ops_used(results):
    assert {"AVG", "PREMUL_SUM"} <= set(results[0]["reduce_ops"])


def test_no_cpu_fallback(results):
    assert results[0]["cpu_fallbacks"] == "{}"
