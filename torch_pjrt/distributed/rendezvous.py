"""Bringing up JAX's multi-process runtime (jax.distributed) before PJRT starts.

JAX must know the job's processes before it starts a PJRT client, so the runtime asks
here first (runtime.platform.before_start): when torchrun's variables say WORLD_SIZE > 1,
every process connects to JAX's coordination service (hosted by rank 0 at MASTER_ADDR
and MASTER_PORT + 1, or TORCH_PJRT_COORDINATOR) and the PJRT client then runs
collectives with the other processes (gloo on XLA:CPU, NCCL on GPUs, the ICI on TPUs).
A job whose processes are described only by init_process_group's arguments (a tcp://
or file:// init_method) starts it from the process group's store instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from .. import _env
from ..runtime import platform


@dataclass(frozen=True)
class World:
    """This process's place in the job: JAX process index = torch global rank."""

    rank: int
    size: int
    local_rank: int
    local_size: int

    @property
    def host_ranks(self) -> list[int]:
        """The global ranks of this host's processes, in local rank order (torchrun gives
        each host a contiguous block of ranks)."""
        first = self.rank - self.local_rank
        return list(range(first, first + self.local_size))


_HEARTBEAT_S = 100  # JAX's default: a process silent this long counts as dead
_world: World | None = None  # set once jax.distributed is up (None: single process)


def world() -> World | None:
    return _world


def env_world() -> World | None:
    """The job torchrun's variables describe, if they describe several processes."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1 or "RANK" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size if "LOCAL_RANK" not in os.environ
                                    else local_rank + 1))
    return World(rank, size, local_rank, max(local_size, local_rank + 1))


def start_from_env() -> list[int] | None:
    """runtime.platform.before_start: bring up jax.distributed if torchrun's variables say
    WORLD_SIZE > 1; the JAX process indices whose devices are pjrt:0, pjrt:1, ..."""
    if _world is not None:
        return _world.host_ranks
    w = env_world()
    if w is None:
        return None
    coordinator = _env.get("TORCH_PJRT_COORDINATOR").strip()
    if not coordinator:
        try:
            addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except (KeyError, ValueError):
            raise RuntimeError(
                f"torch_pjrt: WORLD_SIZE={w.size} but MASTER_ADDR/MASTER_PORT are not set: "
                "start the job with torchrun, or set TORCH_PJRT_COORDINATOR=host:port (the "
                "address rank 0 serves JAX's coordination service on)") from None
        coordinator = f"{addr}:{port + 1}"
    _initialize(coordinator, w)
    return w.host_ranks


def start_from_store(store, rank: int, size: int, timeout_s: float) -> None:
    """Bring up jax.distributed for a job described by init_process_group's arguments:
    rank 0 serves the coordination service on a free port and publishes its address in
    the process group's store. All processes are taken to be on one host."""
    key = "torch_pjrt/coordinator"
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        store.set(key, f"{host}:{port}")
    coordinator = store.get(key).decode()
    _initialize(coordinator, World(rank, size, rank, size), timeout_s)


def _initialize(coordinator: str, w: World, timeout_s: float = 300.0) -> None:
    global _world
    import jax

    from ..runtime import shim

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # One device per process: on GPUs the one of its local rank (the others stay free
    # for the other processes' clients).
    local_ids = None if platform.cpu_platform() else [w.local_rank]
    # When JAX's heartbeats say a process died, it ends the others (its callback for that
    # case cannot be a Python function in jaxlib 0.10.2: passing one aborts the process
    # with std::bad_cast when it fires). Collectives raise earlier: agreement.py.
    jax.distributed.initialize(
        coordinator, num_processes=w.size, process_id=w.rank,
        local_device_ids=local_ids, initialization_timeout=max(int(timeout_s), 1),
        heartbeat_timeout_seconds=_HEARTBEAT_S)
    _world = w
    shim().set_default_device(w.local_rank)

