"""Faults never hang and are never silent: ranks that call a collective with another
shape, dtype, collective or reduce op, or a rank that never calls it (it raised, or
died), make every rank that called it raise DistBackendError within the process
group's timeout (3 s here), naming the collective and the ranks."""

import launch
import pytest

TIMEOUT_S = 3
SLACK_S = 20  # a loaded 2-core machine


@pytest.fixture(scope="module")
def mismatches():
    return launch.run("workers_faults:mismatches", nprocs=2, timeout=240)


@pytest.mark.parametrize("case,words", [
    ("shape", ["all_reduce(float32[4], SUM)", "all_reduce(float32[5], SUM)"]),
    ("dtype", ["all_reduce(float32[4], SUM)", "all_reduce(bfloat16[4], SUM)"]),
    ("op", ["all_reduce(float32[4], SUM)", "broadcast(float32[4], root 0)"]),
    ("reduce_op", ["all_reduce(float32[4], SUM)", "all_reduce(float32[4], MAX)"]),
])
def test_a_mismatch_raises_on_every_rank_naming_both_calls(mismatches, case, words):
    for rank, r in enumerate(mismatches):
        got = r[case]
        assert got["is_dist_error"], f"rank {rank}: {got}"
        assert "collective mismatch" in got["message"]
        for w in words + ["rank 0", "rank 1"]:
            assert w in got["message"], f"rank {rank}: {w!r} not in {got['message']!r}"
        assert got["seconds"] < TIMEOUT_S + SLACK_S


def test_a_shape_mismatch_leaves_the_tensor_alone(mismatches):
    assert mismatches[0]["shape_value"] == [1.0] * 4
    assert mismatches[1]["shape_value"] == [1.0] * 5


def test_a_rank_that_never_calls_times_out_the_others(mismatches):
    got = mismatches[0]["missing"]
    assert got["is_dist_error"], got
    assert "all_reduce(float32[4], SUM)" in got["message"]
    assert f"timed out after {TIMEOUT_S} s" in got["message"]
    assert "rank(s) 1 did not call it" in got["message"]
    assert TIMEOUT_S - 0.5 < got["seconds"] < TIMEOUT_S + SLACK_S
    after = mismatches[0]["after"]  # the group stays broken, and says why
    assert after["is_dist_error"] and "unusable after an earlier error" in after["message"]


def test_other_groups_still_work(mismatches):
    assert [r["world_after"] for r in mismatches] == [[3.0, 3.0]] * 2


def test_a_dead_rank_times_out_the_others():
    got = launch.run("workers_faults:dead_rank", nprocs=2, timeout=240, expect_failure=True)
    (code0, result0, _), (code1, _, _) = got
    assert code1 == 3
    assert result0["first"] == [2.0] * 4
    second = result0["second"]
    assert second["is_dist_error"], second
    assert "all_reduce(float32[4], SUM)" in second["message"]
    assert "rank(s) 1 did not call it" in second["message"]
    assert second["seconds"] < TIMEOUT_S + SLACK_S
