"""2-D parallelism on pjrt: FSDP2 over the "dp" dimension and DTensor tensor parallelism
(Colwise/RowwiseParallel) over "tp" of a 2x2 mesh of 4 processes; losses and parameters
after 3 Adam steps of two transformer blocks equal one CPU process on the global batch.
Four processes: behind TORCH_PJRT_SLOW_TESTS=1."""

import os

import launch
import pytest

SLOW = os.environ.get("TORCH_PJRT_SLOW_TESTS", "").strip() not in ("", "0")


@pytest.mark.skipif(not SLOW, reason="four processes: set TORCH_PJRT_SLOW_TESTS=1")
def test_fsdp_by_tp_on_a_2x2_mesh():
    results = launch.run("workers_2d:run_all", nprocs=4, timeout=900)
    for rank, r in enumerate(results):
        assert "error" not in r, f"rank {rank}: {r['error']}"
        assert max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"])) < 3e-5, r
        assert r["param_diff"] < 3e-4, (rank, r["param_diff"])
