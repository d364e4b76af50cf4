"""torch.distributed.checkpoint on pjrt, 2 processes: an FSDP2 model and its AdamW state
saved after 2 steps (each rank its shards) and loaded into a new model and optimizer;
the resumed run's losses equal the uninterrupted run's, bit for bit."""

import launch
import pytest


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_checkpoint:run_all", nprocs=2, timeout=300)


def test_no_error(results):
    for rank, r in enumerate(results):
        assert "error" not in r, f"rank {rank}: {r['error']}"


def test_each_rank_wrote_its_shards(results):
    files = results[0]["files"]
    assert ".metadata" in files
    assert {f for f in files if f.endswith(".distcp")} == {"__0_0.distcp", "__1_0.distcp"}


def test_resumed_run_equals_uninterrupted(results):
    for r in results:
        assert r["shard_device"] == "pjrt:" + str(results.index(r))
        assert len(r["uninterrupted"]) == 4
        assert r["resumed"] == r["uninterrupted"]
