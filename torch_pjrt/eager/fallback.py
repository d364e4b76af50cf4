"""Ops without a lowering: PyTorch's decomposition if there is one, else the CPU.

The CPU path copies the inputs to the host, runs PyTorch's CPU kernel and copies
the results back; mutated arguments are written back into the pjrt tensors, so
in-place and out= semantics (and views of them) are kept. Every such op is
counted in torch_pjrt.metrics() and reported once; TORCH_PJRT_CPU_FALLBACK=0
turns it into an error.
"""

from __future__ import annotations

import warnings

import torch
import torch._prims_common as _prims
from torch._decomp import decomposition_table

from .. import _env, counters
from ..lowering.checks import type_name
from ..runtime import watch
from . import opspec, unchecked
from .meta import refuse_dtypes

_warned: set[str] = set()
_active_decomps: set = set()

# Decompositions we do not take (they recurse into the op itself, or are slower
# than the CPU), with a reason each.
SKIP_DECOMPOSITION: dict[str, str] = {}


def _check_grid_sampler_2d(input, grid, *args, **kwargs) -> None:
    """The CPU kernel's checks (check_grid_sampler_common, check_grid_sampler_2d), which
    PyTorch's decomposition lacks: it unpacked a 5-D input's shape (ValueError), or
    asserted, where the CPU says what is wrong (PyTorch's test_invalid_shapes_grid_sampler)."""
    sizes = f"input with sizes {list(input.shape)} and grid with sizes {list(grid.shape)}"
    if input.device != grid.device:
        raise RuntimeError("grid_sampler(): expected input and grid to be on same device, but "
                           f"input is on {input.device} and grid is on {grid.device}")
    if input.dim() and grid.dim() and input.shape[0] != grid.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, "
                           f"but got {sizes}")
    if grid.dim() and grid.shape[-1] != input.dim() - 2:
        raise RuntimeError(f"grid_sampler(): expected grid to have size {input.dim() - 2} in "
                           f"last dimension, but got grid with sizes {list(grid.shape)}")
    for i in range(2, input.dim()):
        if input.shape[i] <= 0:
            raise RuntimeError("grid_sampler(): expected input to have non-empty spatial "
                               f"dimensions, but input has sizes {list(input.shape)} with "
                               f"dimension {i} being empty")
    if input.dim() != 4 or grid.dim() != 4:
        raise RuntimeError("grid_sampler(): expected 4D input and grid with same number of "
                           f"dimensions, but got {sizes}")
    if input.dtype != grid.dtype:
        raise RuntimeError(f"expected scalar type {type_name(input.dtype)} but found "
                           f"{type_name(grid.dtype)}")


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's get_overlap_status(a, b) == Partial: dense views of one storage whose spans
    meet and are not the same view."""
    if a is b or a.numel() == 0 or b.numel() == 0:
        return False
    if not (_prims.is_non_overlapping_and_dense_or_false(a)
            and _prims.is_non_overlapping_and_dense_or_false(b)):
        return False  # TooHard: the CPU does not refuse
    if torch._C._storage_address(a) != torch._C._storage_address(b):
        return False
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if (a_begin, a_end) == (b_begin, b_end):
        return a.stride() != b.stride()
    return a_begin < b_end and b_begin < a_end


def _check_no_partial_overlap(self, *args, **kwargs) -> None:
    """TensorIterator's check of an in-place op, before its dtypes: PyTorch's in-place
    decomposition (the op, then self.copy_) never compared self with the other inputs, so
    x[:-1] <<= x[1:] ran where the CPU refuses it (PyTorch's test_shift_mem_overlap)."""
    for t in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor) and _partial_overlap(self, t):
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to "
                "tensor refer to a single memory location. Please clone() the tensor before "
                "performing the operation.")


_aten = torch.ops.aten
# Checks the CPU kernel makes and PyTorch's decomposition does not, run before it.
_DECOMPOSITION_CHECKS = {
    _aten.grid_sampler_2d.default: _check_grid_sampler_2d,
    # in-place TensorIterator ops decomposed as the op and a copy_
    **{op: _check_no_partial_overlap for op in (
        _aten.__ilshift__.Tensor, _aten.__irshift__.Tensor, _aten.__iand__.Tensor,
        _aten.__ior__.Tensor, _aten.__ixor__.Tensor)},
}


def run(op: torch._ops.OpOverload, *args, **kwargs):
    """The PrivateUse1 fallback kernel."""
    decomp = decomposition_table.get(op)
    if decomp is not None and op not in _active_decomps and str(op) not in SKIP_DECOMPOSITION:
        check = _DECOMPOSITION_CHECKS.get(op)
        if check is not None:
            check(*args, **kwargs)
        refuse_dtypes(op, args, kwargs)
        counters.count("decompositions")
        _active_decomps.add(op)
        try:
            return decomp(*args, **kwargs)
        finally:
            _active_decomps.discard(op)
    return cpu_fallback(op, args, kwargs)


def _shared_storages(tree, pjrt: str) -> set[int]:
    """The pjrt storages (by their StorageImpl's address) that more than one tensor argument
    uses."""
    seen: set[int] = set()
    shared: set[int] = set()
    for t in torch.utils._pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor) and t.device.type == pjrt and t.layout == torch.strided:
            ptr = torch._C._storage_address(t)  # (data_ptr() would materialize a lazy clone)
            (shared if ptr in seen else seen).add(ptr)
    return shared


def _pjrt_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def _check_written_devices(op, args: tuple, kwargs: dict, pjrt: str) -> None:
    """An out= or in-place argument on another device than the call's pjrt tensors raises,
    as the CPU's and CUDA's kernels raise (the CPU kernel run here would write it)."""
    spec = opspec.spec(op)
    if not spec.mutated:
        return
    values = opspec.normalize(spec, args, kwargs)
    here = next((t.device for t in torch.utils._pytree.tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor) and t.device.type == pjrt), None)
    if here is None:
        return
    for pos in spec.mutated:
        for t in torch.utils._pytree.tree_leaves(values[pos]):
            if isinstance(t, torch.Tensor) and t.device.type != pjrt:
                raise RuntimeError(
                    f"{op}: Expected all tensors to be on the same device, but found at least "
                    f"two devices, {here} and {t.device}! (the result argument "
                    f"'{spec.args[pos].name}' is on {t.device})")


def cpu_fallback(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    name = str(op)
    if not _env.flag("TORCH_PJRT_CPU_FALLBACK"):
        raise RuntimeError(
            f"pjrt: {name} has no lowering for the pjrt device, and CPU fallback is off "
            "(TORCH_PJRT_CPU_FALLBACK=0)"
        )
    counters.count_fallback(name)
    watch.fell_back(name)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"pjrt: {name} has no lowering; it runs on the CPU (inputs copied to the host and "
            "back). See torch_pjrt.metrics()['cpu_fallbacks'].",
            stacklevel=3,
        )
    pjrt = _pjrt_type()
    _check_written_devices(op, args, kwargs, pjrt)
    device = None
    shared = _shared_storages((args, kwargs), pjrt)
    hosts: dict[tuple, torch.Tensor] = {}  # a shared storage's CPU copy, by (pointer, dtype)
    same: dict[int, torch.Tensor] = {}  # a tensor passed twice stays one tensor

    def to_cpu(x):
        nonlocal device
        if isinstance(x, torch.Tensor) and x.device.type == pjrt:
            device = device or x.device
            host = host_copy(x)
            # as the tensor says: a few CPU kernels read it (sparse mm's amax/amin keep
            # the argmax for the backward only then; without it the backward reads an
            # empty one and crashes). Below autograd, the CPU call records nothing.
            if x.requires_grad and not host.requires_grad:
                host.requires_grad_()
            return host
        if isinstance(x, torch.device) and x.type == pjrt:
            device = device or x
            return torch.device("cpu")
        if isinstance(x, torch.Generator) and x.device.type == pjrt:
            return None
        if isinstance(x, (list, tuple)):
            return type(x)(to_cpu(v) for v in x)
        return x

    def host_copy(x):
        if x.layout != torch.strided:  # sparse (eager/sparse.py): no storage
            return x.cpu()
        ptr = torch._C._storage_address(x)
        if ptr not in shared:
            return x.cpu()
        # Arguments sharing a storage share it on the CPU too, so that the CPU kernel
        # sees (and refuses, as PyTorch does) an out= argument overlapping an input.
        if id(x) not in same:
            host = hosts.get((ptr, x.dtype))
            if host is None:
                s = x.untyped_storage()
                whole = torch.empty(0, dtype=x.dtype, device=x.device)
                host = hosts[(ptr, x.dtype)] = whole.set_(
                    s, 0, (s.nbytes() // x.element_size(),)).cpu()
            same[id(x)] = host.as_strided(x.shape, x.stride(), x.storage_offset())
        return same[id(x)]

    cpu_args = [to_cpu(a) for a in args]
    cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    spec = opspec.spec(op)
    if name in unchecked.CHECKS:
        unchecked.CHECKS[name](opspec.normalize(spec, tuple(cpu_args), cpu_kwargs))
    out = op(*cpu_args, **cpu_kwargs)

    # Write mutated arguments back into the pjrt tensors they came from.
    originals = opspec.normalize(spec, args, kwargs)
    copies = opspec.normalize(spec, tuple(cpu_args), cpu_kwargs)
    for pos in spec.mutated:
        orig, copy = originals[pos], copies[pos]
        pairs = zip(orig, copy) if isinstance(orig, (list, tuple)) else [(orig, copy)]
        for o, c in pairs:
            if isinstance(o, torch.Tensor) and o.device.type == pjrt:
                if o.layout == torch.sparse_coo:  # (copy_ itself runs here for sparse COO)
                    torch.ops.aten.copy_sparse_to_sparse_(o, c)
                    continue
                if o.layout != torch.strided:  # compressed: indices and values copied
                    if o._nnz() != c._nnz():
                        torch.ops.aten.resize_as_sparse_(o, c)
                    o.copy_(c)
                    continue
                if o.shape != c.shape:
                    o.resize_(c.shape)
                o.copy_(c)

    def back(x, ret_index=None):
        if isinstance(x, torch.Tensor):
            for pos in spec.mutated:
                if copies[pos] is x:
                    return originals[pos]
            return x.to(device) if device is not None else x
        if isinstance(x, (list, tuple)):
            return type(x)(back(v) for v in x)
        return x

    return back(out)
