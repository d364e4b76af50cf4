"""Process groups and device meshes of the `pjrt` backend: init_process_group with no
backend and a device_id, new_group, groups of one, 1-D and 2-D DeviceMesh, DTensor over
a mesh, destroy and initialize again, a job started from a tcp:// address instead of
torchrun's variables, and device indices across processes."""

import os

import launch
import pytest

SLOW = os.environ.get("TORCH_PJRT_SLOW_TESTS", "").strip() not in ("", "0")


@pytest.fixture(scope="module")
def two():
    return launch.run("workers_groups:two_processes", nprocs=2, timeout=300)


def test_no_backend_with_device_id_picks_pjrt(two):
    assert [r["backend"] for r in two] == ["pjrt", "pjrt"]


def test_each_process_computes_on_its_local_rank_device(two):
    assert [r["current_device"] for r in two] == [0, 1]
    assert [r["device_count"] for r in two] == [2, 2]


def test_another_process_device_raises_naming_it(two):
    assert "pjrt:1 is the device of another process" in two[0]["foreign_device"]
    assert "pjrt:0 is the device of another process" in two[1]["foreign_device"]


def test_world_and_new_groups(two):
    for r in two:
        assert r["world"] == r["new_group"] == 3.0
        assert r["new_group_backend"] == "pjrt"
    assert [r["singleton"] for r in two] == [1.0, 2.0]


def test_device_mesh_and_dtensor(two):
    for rank, r in enumerate(two):
        assert r["mesh_group"] == 3.0
        assert r["local_shard"] == [[4.0 * rank, 4.0 * rank + 1], [4.0 * rank + 2,
                                                                   4.0 * rank + 3]]
        assert r["full_tensor"] == r["redistribute"] == [[0.0, 1.0], [2.0, 3.0],
                                                         [4.0, 5.0], [6.0, 7.0]]


def test_2d_meshes_of_two_processes(two):
    for rank, r in enumerate(two):
        assert r["mesh(2, 1)dp"] == r["mesh(1, 2)tp"] == 3.0
        assert r["mesh(2, 1)tp"] == r["mesh(1, 2)dp"] == rank + 1.0


def test_destroy_and_initialize_again(two):
    for r in two:
        assert r["after_destroy"] is False
        assert r["reinit"] == r["reinit_cpu"] == 3.0


def test_job_from_a_tcp_address_without_torchrun_variables():
    got = launch.run("workers_groups:from_store", nprocs=2, timeout=300)
    assert got == [{"world": 3.0, "current_device": 0}, {"world": 3.0, "current_device": 1}]


@pytest.mark.skipif(not SLOW, reason="four processes: set TORCH_PJRT_SLOW_TESTS=1")
def test_2x2_mesh_and_groups_of_some_processes():
    got = launch.run("workers_groups:four_processes", nprocs=4, timeout=600)
    for rank, r in enumerate(got):
        assert r["world"] == r["world_again"] == 10.0
        assert r["dp"] == sum(x + 1 for x in r["dp_ranks"])
        assert r["tp"] == sum(x + 1 for x in r["tp_ranks"])
        if rank in (1, 2):
            assert r["pair"] == 5.0 and r["pair_p2p"] == [1.0] * 4
