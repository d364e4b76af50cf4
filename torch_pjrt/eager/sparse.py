"""Sparse tensors on pjrt (COO, and the compressed layouts CSR, CSC, BSR, BSC): PyTorch's own
sparse tensor impls, whose indices and values are dense pjrt tensors, with every sparse
kernel run on the CPU.

XLA arrays are dense, so pjrt has no sparse kernel of its own. A sparse pjrt tensor is still
a real one (layout torch.sparse_coo or a compressed one, device pjrt, the SparsePrivateUse1
or SparseCsrPrivateUse1 dispatch key), so code that builds sparse tensors, sparse gradients
(nn.Embedding(sparse=True)) and sparse masks runs unchanged. Two kinds of the CPU's sparse
kernels serve it:

- the ones that only touch the tensor's metadata or call other ops on its indices and values
  (constructors, getters, resizing, copying one sparse tensor into another): registered for
  the pjrt keys as they are, they work on any device;
- every other sparse op runs on the CPU through the CPU fallback (eager/fallback.py: the
  operands copied to the host, the results back), counted and warned as any fallback.
"""

from __future__ import annotations

import torch

# pjrt's dispatch key -> the CPU's, and the CPU kernels of that key that read no element on
# the host: SparseTensor.cpp's constructors, getters and resizes (copy_sparse_to_sparse_
# moves the source's indices and values with Tensor.to onto the destination's device), and
# the compressed layouts' getters and copy_ (which copies indices and values tensor by
# tensor, with the dispatcher).
DEVICE_GENERIC: dict[str, tuple[str, frozenset[str]]] = {
    "SparsePrivateUse1": ("SparseCPU", frozenset({
        "aten::_sparse_coo_tensor_with_dims_and_tensors", "aten::_sparse_coo_tensor_with_dims",
        "aten::empty.memory_format", "aten::_indices", "aten::_values", "aten::indices",
        "aten::values", "aten::_nnz", "aten::sparse_dim", "aten::dense_dim", "aten::_dimI",
        "aten::_dimV", "aten::is_coalesced", "aten::_coalesced_", "aten::sparse_resize_",
        "aten::sparse_resize_and_clear_", "aten::copy_sparse_to_sparse_"})),
    "SparseCsrPrivateUse1": ("SparseCsrCPU", frozenset({
        "aten::empty.memory_format", "aten::crow_indices", "aten::col_indices",
        "aten::ccol_indices", "aten::row_indices", "aten::values", "aten::_nnz",
        "aten::sparse_dim", "aten::dense_dim", "aten::copy_", "aten::resize_as_sparse_"})),
}


def _op(qualname: str) -> torch._ops.OpOverload:
    name, _, overload = qualname.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")


def _as_on_cpu(op: torch._ops.OpOverload, cpu_key: str):
    keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, cpu_key))

    def kernel(*args, **kwargs):
        return op.redispatch(keys, *args, **kwargs)

    return kernel


def install(run_on_cpu) -> list[torch.library.Library]:
    """Register a kernel of each pjrt sparse key for each op that has one for the CPU's (an
    op with none raises as on the CPU through `run_on_cpu`, the CPU fallback, which the
    caller registers as the keys' fallback). Returns the libraries, which must stay alive."""
    libs = []
    for key, (cpu_key, generic) in DEVICE_GENERIC.items():
        lib = torch.library.Library("aten", "IMPL", key)
        for qualname in sorted(torch._C._dispatch_get_registrations_for_dispatch_key(cpu_key)):
            if not qualname.startswith("aten::"):
                continue
            op = _op(qualname)
            kernel = _as_on_cpu(op, cpu_key) if qualname in generic else \
                (lambda *args, _op=op, **kwargs: run_on_cpu(_op, args, kwargs))
            lib.impl(qualname.removeprefix("aten::"), kernel)
        libs.append(lib)
    return libs
