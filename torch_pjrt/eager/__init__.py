"""Eager execution (strict, fused, debug) of ATen ops on pjrt tensors; start() is what
this layer sets up once PJRT has started (added by torch_pjrt/__init__.py)."""

from __future__ import annotations


def start() -> None:
    """Install the executor and the dispatcher's kernels, and wire the layers below to
    the fused graph: the storage table's reads flush it, synchronize() runs it, waits for
    the storages' buffers and raises the device-side checks' errors. Imports here, not at
    `import torch`: the autoload stays cheap."""
    from .. import _compat, runtime
    from ..lowering import checks
    from ..runtime import sync
    from ..storage import table
    from . import dispatch, executor, graph, modes

    _compat.defer_dynamo_import()  # the meta pass's Python kernels: not Dynamo's import
    native = runtime.shim()
    table.install(native, graph.flush)
    graph.configure()
    modes.init_from_env()
    native.set_free_callback(table.free)
    executor.install(native, runtime.DEVICE_TYPE)
    dispatch.install(*runtime.kernel_libraries())
    sync.on_synchronize(before=lambda: graph.flush("synchronize"),
                        wait=table.wait_for_buffers, after=checks.raise_pending)
