"""torch.distributed on the pjrt device: the c10d backend `pjrt` over XLA's collectives."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .. import _compat, runtime

BACKEND = "pjrt"


def register() -> None:
    """Name the backend (init_process_group("pjrt"), the default for pjrt tensors) and
    let the runtime bring up JAX's multi-process runtime before PJRT starts. Cheap: runs
    at `import torch` (autoload)."""
    from ..runtime import platform

    if _start_from_env not in platform.before_start:
        platform.before_start.append(_start_from_env)
        platform.count_hints.append(_count_from_env)
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=[runtime.DEVICE_TYPE])
        _compat.c10d_backend_not_recorded(BACKEND)


def _start_from_env():
    from . import rendezvous

    return rendezvous.start_from_env()


def _count_from_env() -> int | None:
    """A torchrun job's device count before PJRT starts: one per process on this host."""
    from . import rendezvous

    w = rendezvous.world() or rendezvous.env_world()
    return None if w is None else len(w.host_ranks)


def _create(opts, backend_options=None) -> dist.ProcessGroup:
    """The c10d backend creator: a ProcessGroupPjrt for one group (it replaces the whole
    group, so with "cpu:gloo,pjrt:pjrt" CPU tensors come to it too and go to gloo)."""
    from .process_group import ProcessGroupPjrt

    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else \
        timedelta(milliseconds=opts.timeout)
    _start(opts.store, opts.group_rank, opts.group_size, ranks, timeout)
    runtime.ensure_initialized()
    _install_compiled()
    return ProcessGroupPjrt(opts.store, opts.group_rank, opts.group_size, timeout, ranks,
                            opts.group_id)


def _install_compiled() -> None:
    """Compiled graphs with collectives: the lowerings of the functional collectives and
    the SPMD runner (needed once a process group exists)."""
    from ..compile import graph
    from . import compiled, lowerings  # noqa: F401 (registers the lowerings)

    if compiled.build not in graph.program_hooks:
        graph.program_hooks.append(compiled.build)


def _start(store, rank: int, size: int, ranks: list[int], timeout: timedelta) -> None:
    """Make sure JAX's multi-process runtime spans the job before the group uses it."""
    import jax

    from ..runtime import client
    from . import rendezvous

    if not client.started():
        if rendezvous.env_world() is None and size > 1 and ranks == list(range(size)):
            rendezvous.start_from_store(store, rank, size, timeout.total_seconds())
        runtime.ensure_initialized()
    job = max(ranks) + 1
    if jax.process_count() < job:
        raise RuntimeError(
            f"pjrt: a process group of ranks {ranks} needs a job of at least {job} "
            f"processes, but the pjrt runtime started as {jax.process_count()} process(es) "
            "(it starts at the first pjrt tensor or device query): start the job with "
            "torchrun (or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), or call "
            "init_process_group before using the pjrt device")
