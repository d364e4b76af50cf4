"""Rank code of test_groups.py: the ways to make process groups and device meshes."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def _sum_of_ranks(ranks, group=None) -> float:
    """all_reduce of (global rank + 1) over `group`, on pjrt."""
    t = torch.full((3,), float(dist.get_rank() + 1), device="pjrt")
    dist.all_reduce(t, group=group)
    got = t.cpu().tolist()
    assert got == [float(sum(r + 1 for r in ranks))] * 3, got
    return got[0]


def two_processes() -> dict:
    out = {}
    rank = int(os.environ["RANK"])
    # no backend, device_id: the default backend of the pjrt device
    dist.init_process_group(device_id=torch.device("pjrt", rank),
                            timeout=timedelta(seconds=30))
    out["backend"] = dist.get_backend()
    out["current_device"] = torch.pjrt.current_device()
    out["device_count"] = torch.pjrt.device_count()
    out["world"] = _sum_of_ranks([0, 1])
    # pjrt:<other rank> is a device of the other process
    other = 1 - rank
    try:
        torch.ones(1, device=f"pjrt:{other}")
        out["foreign_device"] = "no error"
    except RuntimeError as e:
        out["foreign_device"] = str(e)
    # new_group: the whole world again, and with its own timeout
    g = dist.new_group([0, 1], timeout=timedelta(seconds=20))
    out["new_group"] = _sum_of_ranks([0, 1], g)
    out["new_group_backend"] = dist.get_backend(g)
    # a group of one
    g0, g1 = dist.new_group([0]), dist.new_group([1])
    mine = g0 if rank == 0 else g1
    out["singleton"] = _sum_of_ranks([rank], mine)
    # 1-D device mesh and DTensor over it
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("pjrt", (2,), mesh_dim_names=("dp",))
    out["mesh_group"] = _sum_of_ranks([0, 1], mesh.get_group("dp"))
    full = torch.arange(8.0).reshape(4, 2)
    d = distribute_tensor(full.to("pjrt"), mesh, [Shard(0)])
    out["local_shard"] = d.to_local().cpu().tolist()
    out["full_tensor"] = d.full_tensor().cpu().tolist()
    out["redistribute"] = d.redistribute(mesh, [Replicate()]).to_local().cpu().tolist()
    # 2-D meshes of two processes: a dimension of size one is a group of one
    for shape in ((2, 1), (1, 2)):
        mesh2 = init_device_mesh("pjrt", shape, mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            group = mesh2.get_group(dim)
            out[f"mesh{shape}{dim}"] = _sum_of_ranks(dist.get_process_group_ranks(group), group)
    # destroy and initialize again in the same process
    dist.destroy_process_group()
    out["after_destroy"] = dist.is_initialized()
    dist.init_process_group("pjrt", timeout=timedelta(seconds=30))
    out["reinit"] = _sum_of_ranks([0, 1])
    out["reinit_cpu"] = _cpu_sum()
    dist.destroy_process_group()
    return out


def _cpu_sum() -> float:
    t = torch.full((2,), float(dist.get_rank() + 1))
    dist.all_reduce(t)  # a CPU tensor in a "pjrt" group: gloo
    return t[0].item()


def four_processes() -> dict:
    """A 2x2 device mesh, groups of a subset of the ranks (XLA programs that only some
    processes of the job run)."""
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    mesh = init_device_mesh("pjrt", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    out["backend"] = dist.get_backend()
    out["world"] = _sum_of_ranks(range(4))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    out["dp_ranks"] = dist.get_process_group_ranks(dp)
    out["tp_ranks"] = dist.get_process_group_ranks(tp)
    out["dp"] = _sum_of_ranks(out["dp_ranks"], dp)
    out["tp"] = _sum_of_ranks(out["tp_ranks"], tp)
    # a group of two of the four, the others not taking part
    pair = dist.new_group([1, 2])
    if rank in (1, 2):
        out["pair"] = _sum_of_ranks([1, 2], pair)
        x = torch.full((4,), float(rank), device="pjrt")
        if rank == 1:
            dist.send(x, 2)
        else:
            dist.recv(x, 1)
        out["pair_p2p"] = x.cpu().tolist()
    out["world_again"] = _sum_of_ranks(range(4))
    dist.destroy_process_group()
    return out


def from_store() -> dict:
    """init_process_group with a tcp:// address and explicit ranks, no torchrun variables:
    JAX's multi-process runtime starts from the group's store."""
    rank, size = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    addr, port = os.environ.pop("MASTER_ADDR"), os.environ.pop("MASTER_PORT")
    for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(var)
    dist.init_process_group("pjrt", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=30))
    out = {"world": _sum_of_ranks([0, 1]), "current_device": torch.pjrt.current_device()}
    dist.destroy_process_group()
    return out
