"""`torchrun --nproc-per-node 2 -m torch_pjrt demo --parallel ddp|fsdp|tp`: each kind's
losses on 2 processes equal one CPU process on the global batch (3 AdamW steps of the
tiny GPT; the evaluation before training included, which FSDP2 must reshard after)."""

import launch
import pytest

from torch_pjrt.demo import parallel


@pytest.fixture(scope="module")
def results():
    return launch.run("workers_demo:run_all", nprocs=2, timeout=420)


@pytest.mark.parametrize("kind", parallel.KINDS)
def test_losses_equal_one_process_on_the_global_batch(results, kind):
    want = results[0][kind]["cpu_losses"]
    assert len(want) == 3 and want[-1] < want[0]
    for rank, r in enumerate(results):
        got = r[kind]["losses"]
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (rank, got, want)
