"""Sparse COO tensors on pjrt: PyTorch's own SparseTensorImpl, whose indices and values are
dense pjrt tensors, with every sparse kernel run on the CPU.

XLA arrays are dense, so pjrt has no sparse kernel of its own. A sparse pjrt tensor is still
a real one (layout torch.sparse_coo, device pjrt, the SparsePrivateUse1 dispatch key), so
code that builds sparse tensors, sparse gradients (nn.Embedding(sparse=True)) and sparse
masks runs unchanged. Two kinds of SparseCPU kernels serve it:

- the ones that only touch the tensor's metadata or call other ops on its indices and values
  (constructors, getters, resizing, copying one sparse tensor into another): registered for
  SparsePrivateUse1 as they are, they work on any device;
- every other sparse op runs on the CPU through the CPU fallback (eager/fallback.py: the
  operands copied to the host, the results back), counted and warned as any fallback.
"""

from __future__ import annotations

import torch

_SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)

# SparseCPU kernels that read no element on the host (SparseTensor.cpp's constructors,
# getters and resizes; copy_sparse_to_sparse_ moves the source's indices and values with
# Tensor.to onto the destination's device).
DEVICE_GENERIC = frozenset({
    "aten::_sparse_coo_tensor_with_dims_and_tensors", "aten::_sparse_coo_tensor_with_dims",
    "aten::empty.memory_format", "aten::_indices", "aten::_values", "aten::indices",
    "aten::values", "aten::_nnz", "aten::sparse_dim", "aten::dense_dim", "aten::_dimI",
    "aten::_dimV", "aten::is_coalesced", "aten::_coalesced_", "aten::sparse_resize_",
    "aten::sparse_resize_and_clear_", "aten::copy_sparse_to_sparse_",
})


def _op(qualname: str) -> torch._ops.OpOverload:
    name, _, overload = qualname.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")


def _as_on_cpu(op: torch._ops.OpOverload):
    def kernel(*args, **kwargs):
        return op.redispatch(_SPARSE_CPU, *args, **kwargs)

    return kernel


def install(run_on_cpu) -> torch.library.Library:
    """Register a SparsePrivateUse1 kernel for each op that has a SparseCPU one (an op with
    none raises as on the CPU, through `run_on_cpu`, the CPU fallback, registered as the
    key's fallback too). Returns the library, which must stay alive."""
    lib = torch.library.Library("aten", "IMPL", "SparsePrivateUse1")
    for qualname in sorted(torch._C._dispatch_get_registrations_for_dispatch_key("SparseCPU")):
        if not qualname.startswith("aten::"):
            continue
        op = _op(qualname)
        kernel = _as_on_cpu(op) if qualname in DEVICE_GENERIC else \
            (lambda *args, _op=op, **kwargs: run_on_cpu(_op, args, kwargs))
        lib.impl(qualname.removeprefix("aten::"), kernel)
    return lib
