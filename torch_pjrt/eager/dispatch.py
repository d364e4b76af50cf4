"""The PrivateUse1 kernels: how each ATen op on a pjrt tensor reaches the executor.

- ops with a lowering (and their in-place and out= variants): the executor;
- view and metadata ops: PyTorch's own CPU kernels, which touch no data, so
  views get PyTorch's sizes, strides, offsets and shared storage;
- allocation, copies across devices, scalars and resizing: the kernels here;
- everything else: the fallback (a decomposition, else the CPU).
"""

from __future__ import annotations

import functools

import torch

from ..lowering import bucket_sizes, checks, registry
from ..storage import table, transfer, views
from . import dynamic, executor, fallback, meta, op_cache, opspec, sparse

aten = torch.ops.aten
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# Ops that only change tensor metadata: served by the CPU kernel, which does
# not read or write data, over the pjrt storage.
METADATA_OPS = (
    aten.view.default, aten.view.dtype, aten._reshape_alias.default, aten.alias.default,
    aten.as_strided.default, aten.detach.default, aten.diagonal.default,
    aten.expand.default, aten.permute.default, aten.select.int, aten.slice.Tensor,
    aten.split.Tensor, aten.split_with_sizes.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.t.default, aten.transpose.int,
    aten.unbind.int, aten.unfold.default, aten.unsqueeze.default,
    aten.view_as_real.default, aten.view_as_complex.default, aten._conj.default,
    aten._neg_view.default, aten.lift_fresh.default,
    aten.as_strided_.default, aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims,
    aten.unsqueeze_.default, aten.transpose_.default, aten.t_.default, aten.detach_.default,
    aten.swapdims_.default, aten.swapaxes_.default,
    aten.set_.source_Storage, aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor,
)


def register_kernel(op: torch._ops.OpOverload) -> None:
    """Serve `op` on pjrt with its lowering: the native kernel of lowered ops
    (runtime/native/op_kernel.cpp), which lives as long as the process."""
    executor._native.register_op_kernels(op.namespace, [(_qualname(op), opspec.spec(op), None)])


def _variants(op: torch._ops.OpOverload):
    """The in-place and out= overloads whose functional counterpart is `op`."""
    packet_name = op._schema.name.split("::")[1]
    inplace = getattr(aten, packet_name + "_", None)
    if inplace is not None and op._overloadname in inplace.overloads():
        yield getattr(inplace, op._overloadname)
    packet = getattr(aten, packet_name)
    for name in packet.overloads():
        cand = getattr(packet, name)
        if cand is not op and opspec._functional_counterpart(cand) is op:
            yield cand


def _decomposes_above_autograd(op: torch._ops.OpOverload) -> bool:
    """An op PyTorch decomposes before autograd (CompositeImplicitAutograd, no autograd
    kernel of its own): a backend kernel for it would take the place of the decomposition
    in autograd too, and its gradients would be lost (aten._convolution.deprecated's were:
    None, with only a warning). The ops it decomposes into are lowered."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = op._schema.name + _suffix(op)
    return has(name, "CompositeImplicitAutograd") and not has(name, "Autograd")


def lowered_ops() -> list[torch._ops.OpOverload]:
    """Every overload the executor serves: lowered ops and their variants."""
    ops = []
    for op, lowering in registry.table().items():
        if not lowering.eager or _decomposes_above_autograd(op):
            continue
        ops.append(op)
        if op.namespace == "aten":
            ops.extend(v for v in _variants(op) if registry.get(v) is None)
    return list(dict.fromkeys(ops))


# ------------------------------------------------------------ special kernels
def _empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    if memory_format is None or memory_format == torch.contiguous_format:
        stride = views.contiguous_strides(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    return _filled_if_deterministic(table.empty_strided(size, stride, dtype, _index(device)))


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled_if_deterministic(
        table.empty_strided(size, stride, dtype or torch.get_default_dtype(), _index(device)))


def _filled_if_deterministic(t: torch.Tensor) -> torch.Tensor:
    """torch.empty's memory under torch.use_deterministic_algorithms(True) with
    torch.utils.deterministic.fill_uninitialized_memory (its default): NaN for floating and
    complex dtypes, the largest value for integers, True for bool, as PyTorch's CPU and CUDA
    fill it; otherwise pjrt's uninitialized memory reads as zeros."""
    if not (torch.are_deterministic_algorithms_enabled()
            and torch.utils.deterministic.fill_uninitialized_memory) or t.numel() == 0:
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    if t.dtype == torch.uint64:  # 2^64 - 1: all bits set, as int64's -1
        t.view(torch.int64).fill_(-1)
        return t
    return t.fill_(torch.iinfo(t.dtype).max)


def _index(device) -> int:
    if device is None:
        return executor._native.current_device()
    device = torch.device(device)
    return device.index if device.index is not None else executor._native.current_device()


def dense_buffer(t: torch.Tensor):
    """A device buffer holding `t`'s elements densely, in row-major order."""
    rec = table.read_record(t)
    if (t.storage_offset() == 0 and views.is_contiguous(t.shape, t.stride())
            and rec.dtype == table.dtypes.to_jax(t.dtype) and rec.numel == t.numel()):
        return rec.get()
    clone = aten.clone.default(t, memory_format=torch.contiguous_format)
    return table.read_record(clone).get()


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """A dense CPU copy of a pjrt tensor (waits for the device): a synchronization point."""
    buf = dense_buffer(t)
    checks.raise_pending()
    return transfer.device_to_host(buf, t.shape, t.dtype)


def to_cpu_own(t: torch.Tensor) -> torch.Tensor:
    """A dense CPU copy of a pjrt tensor that waits for `t` only: programs launched after
    the one computing it keep running (a serving loop reads a step's tokens while the next
    step runs), and only the device-side checks already computed are raised, the others at
    a later synchronization. Holds the op lock: callable from another thread."""
    executor._native.lock_ops()
    try:
        buf = dense_buffer(t)
    finally:
        executor._native.unlock_ops()
    buf.block_until_ready()
    executor._native.lock_ops()
    try:
        checks.raise_ready()
    finally:
        executor._native.unlock_ops()
    return transfer.device_to_host(buf, t.shape, t.dtype)


# The dtype of a Python number as PyTorch wraps it into a tensor (x.copy_(float("inf"))
# reaches this kernel as the number again: runtime/native/op_kernel.cpp, wrapped_number)
_WRAPPED_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64,
                          complex: torch.complex128}


def _copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False):
    pjrt = executor._PJRT
    if not isinstance(src, torch.Tensor):
        src = torch.tensor(src, dtype=_WRAPPED_NUMBER_DTYPES.get(type(src)))
    if self.device.type != pjrt:  # pjrt -> cpu
        self.copy_(to_cpu(src))
        return self
    rec = table.record_of(self)
    if src.device.type != pjrt:  # cpu -> pjrt
        if (src.dtype == self.dtype and src.shape == self.shape and self.storage_offset() == 0
                and views.is_contiguous(self.shape, self.stride())
                and src.numel() * src.element_size() == rec.nbytes):
            rec.set(transfer.host_to_device(src, rec.device))  # replaces the whole storage
            return self
        src = _upload(src, rec.device)
    elif src.device != self.device:  # pjrt:i -> pjrt:j
        src = _move(src, rec.device)
    return executor.execute(_COPY_SPEC, (self, src, non_blocking), {})


def _upload(cpu: torch.Tensor, device: int) -> torch.Tensor:
    buf = transfer.host_to_device(cpu, device)
    shape = tuple(cpu.shape)
    return table.empty_strided(shape, views.contiguous_strides(shape), cpu.dtype, device, buf)


def _move(src: torch.Tensor, device: int) -> torch.Tensor:
    """`src` on pjrt:`device`, as a dense tensor (a device-to-device transfer)."""
    import jax

    from ..runtime import client

    buf = jax.device_put(dense_buffer(src), client.device(device))
    shape = tuple(src.shape)
    return table.empty_strided(shape, views.contiguous_strides(shape), src.dtype, device, buf)


def _to_copy(self: torch.Tensor, **kwargs):
    device = kwargs.get("device")
    target = torch.device(device) if device is not None else self.device
    if target.type == executor._PJRT and (target.index is None or target == self.device):
        return executor.execute(_TO_COPY_SPEC, (self,), kwargs)
    if _plain_upload(self, target, kwargs):  # a contiguous CPU tensor as it is
        return _upload(self, _index(target))
    # Another device: the layout PyTorch gives (memory_format), filled by copy_.
    meta = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
    meta = aten._to_copy.default(meta, **{**kwargs, "device": "meta", "pin_memory": None})
    out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=target)
    return out.copy_(self)


def _plain_upload(self: torch.Tensor, target: torch.device, kwargs: dict) -> bool:
    """Whether `_to_copy(self, **kwargs)` is a contiguous CPU tensor's upload with nothing
    changed (the usual `.to("pjrt")` of an input): one transfer, without the meta tensors
    and the empty device tensor the general path builds (a third of its host time)."""
    return (target.type == executor._PJRT and self.device.type == "cpu"
            and kwargs.get("dtype") in (None, self.dtype)
            and kwargs.get("layout") in (None, torch.strided) and self.layout == torch.strided
            and kwargs.get("memory_format") in (None, torch.preserve_format,
                                                torch.contiguous_format)
            and self.is_contiguous())


def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm updates the running stats without saying so in its schema; the
    `_native_batch_norm_legit` overloads declare it, so the executor writes them back."""
    if not training:
        return aten._native_batch_norm_legit_no_training.default(
            x, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is None or running_var is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    return aten._native_batch_norm_legit.default(x, weight, bias, running_mean, running_var,
                                                 training, momentum, eps)


# A storage up to this size comes to the host whole for a scalar read of one of its elements
# (transfer.element_to_host keeps the copy for the next read): one program and one transfer
# an element made Python's all() over a million-element tensor take hours.
_WHOLE_STORAGE_READ_BYTES = 4 << 20


def _local_scalar_dense(self: torch.Tensor):
    # the CPU kernel's check (Tensor.item() checks the element count before, in other words)
    if self.numel() == 0:
        raise RuntimeError("_local_scalar_dense: Empty tensor not supported")
    rec = table.read_record(self)
    if rec.nbytes <= _WHOLE_STORAGE_READ_BYTES and rec.dtype == table.dtypes.to_jax(self.dtype):
        buf = rec.get()
        checks.raise_pending()
        return transfer.element_to_host(buf, self.storage_offset())
    return to_cpu(self).item()


def _resize_(self: torch.Tensor, size, memory_format=None):
    stride = views.contiguous_strides(size)
    needed = views.span(size, stride) + self.storage_offset()
    storage = self.untyped_storage()
    if needed * self.element_size() > storage.nbytes():
        rec = table.record(storage)
        # the bytes past the old storage: NaN / the largest value under deterministic
        # algorithms, as the CPU's resize_ fills them (the head is copied over below)
        grown = _filled_if_deterministic(
            table.empty_strided((needed,), (1,), self.dtype, rec.device))
        old = self.as_strided((storage.nbytes() // self.element_size(),), (1,), 0)
        grown[: old.numel()].copy_(old)
        aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYS, self, grown.untyped_storage(), self.storage_offset(), size, stride)
        return self
    return aten.resize_.default.redispatch(_CPU_KEYS, self, size, memory_format=memory_format)


def _record_stream(self: torch.Tensor, stream) -> None:
    """Tensor.record_stream (FSDP2 calls it): nothing to record. A device runs one queue of
    programs in order and XLA keeps a buffer alive while a program reading it runs."""


def _index_fill_kernels() -> dict:
    """index_fill(_) with an index tensor on the CPU, as the CPU kernel takes it (PyTorch's
    device-generic tests fill device tensors at `torch.randint` indices made on the CPU):
    the index goes to self's device first. CUDA refuses such an index here, and pjrt
    refuses it in every other indexing op as CUDA does (gather, index_select...)."""
    def wrap(op):
        kernel = _via_executor(op)

        def index_fill(self, dim, index, value):
            if (index.device.type == "cpu" and index.dim() > 0
                    and self.device.type == executor._PJRT):
                index = index.to(self.device)
            return kernel(self, dim, index, value)
        return index_fill
    ops = (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
           aten.index_fill_.int_Scalar, aten.index_fill_.int_Tensor)
    return {op: wrap(op) for op in ops}


def _attention_kernels() -> dict:
    """SDPA over a key/value cache that grows by a token a step (Hugging Face's
    DynamicCache: a new key length each decode step) runs on one program per bucket of
    lengths (lowering/bucket_sizes.py, TORCH_PJRT_BUCKETS), not one per length: keys and
    values are padded to the bucket and pjrt::attention_prefix attends over the true
    length, a run-time number (on XLA:CPU ATen's kernel over those rows, bit for bit the
    unpadded result). Only for calls with fewer queries than keys (decoding, a chunk
    after cached tokens), no mask, no dropout; every other call, and every call with
    TORCH_PJRT_BUCKETS=0, is the op's own program."""
    op = aten._scaled_dot_product_fused_attention_overrideable.default
    kernel = _via_executor(op)

    def sdpa(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
             return_debug_mask=False, *, scale=None):
        keys = key.shape[-2]
        steps = bucket_sizes.steps_per_octave()
        if (steps and attn_bias is None and dropout_p == 0.0 and not return_debug_mask
                and query.dim() == key.dim() == value.dim() == 4
                and 0 < query.shape[-2] < keys and query.numel() and value.shape[-2] == keys):
            padded = bucket_sizes.bucket(keys, steps)
            if padded != keys:  # (a length that is a bucket itself runs on that one)
                pad = (0, 0, 0, padded - keys)
                key = aten.constant_pad_nd.default(key, pad)
                value = aten.constant_pad_nd.default(value, pad)
            out, lse, seed, offset = torch.ops.pjrt.attention_prefix.default(
                query, key, value, keys, is_causal, scale=scale)
            return out, lse, None, None, query.shape[-2], keys, seed, offset, None
        if scale is None:  # (no keyword: the executor's native key)
            return kernel(query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask)
        return kernel(query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask,
                      scale=scale)
    return {op: sdpa}


_COPY_SPEC: opspec.OpSpec | None = None
_TO_COPY_SPEC: opspec.OpSpec | None = None

SPECIAL_KERNELS = {
    aten.empty.memory_format: _empty_memory_format,
    aten.empty_strided.default: _empty_strided,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.resize_.default: _resize_,
    aten.record_stream.default: _record_stream,
}


def _via_executor(op):
    return functools.partial(executor.kernel, opspec.spec(op))


def _index_mask_kernels() -> dict:
    """Lowered indexing ops whose calls with boolean masks turn the masks into indices
    first: the native kernel hands those calls (only) to these."""
    return {
        aten.index.Tensor: dynamic.make_index(_via_executor(aten.index.Tensor)),
        aten.index_put.default: dynamic.make_index_put(
            _via_executor(aten.index_put.default), False),
        aten.index_put_.default: dynamic.make_index_put(
            _via_executor(aten.index_put_.default), True),
    }


def _refusing(op, kernel):
    """`kernel`, raising first where the CPU and CUDA refuse the call's dtypes."""
    def checked(*args, **kwargs):
        meta.refuse_dtypes(op, args, kwargs, sized=False)
        return kernel(*args, **kwargs)
    return checked


def _data_dependent_kernels() -> dict:
    """Data-dependent ops, and the indexing op with masks the native kernel does not see."""
    kernels = {
        aten._index_put_impl_.default: dynamic.make_index_put(
            _via_executor(aten.index_put_.default), True),
        aten.nonzero.default: dynamic.nonzero,
        aten.masked_select.default: dynamic.masked_select,
        aten._unique2.default: dynamic.unique2,
        aten._unique.default: dynamic.unique,
        aten.unique_consecutive.default: dynamic.unique_consecutive,
        aten.unique_dim.default: dynamic.unique_dim,
        aten.unique_dim_consecutive.default: dynamic.unique_dim_consecutive,
        aten.bincount.default: dynamic.bincount,
        aten.repeat_interleave.Tensor: dynamic.repeat_interleave,
    }
    return {op: _refusing(op, k) for op, k in kernels.items()}


def install(lib: torch.library.Library, fallback_lib: torch.library.Library) -> None:
    global _COPY_SPEC, _TO_COPY_SPEC
    registry.load_all()
    op_cache.hook_default_dtype()
    op_cache.hook_deterministic_algorithms()
    _COPY_SPEC = opspec.spec(aten.copy_.default)
    _TO_COPY_SPEC = opspec.spec(aten._to_copy.default)
    executor._native.register_metadata_ops([_qualname(op) for op in METADATA_OPS])
    special = {**SPECIAL_KERNELS, **_data_dependent_kernels(), **_index_fill_kernels(),
               **_attention_kernels()}
    for op, fn in special.items():
        lib.impl(_qualname(op), _taking_turns(fn))
    # Lowered ops: the native kernel (runtime/native/op_kernel.cpp), per namespace.
    masks = _index_mask_kernels()
    by_namespace: dict[str, list] = {}
    for op in lowered_ops():
        if op in special or op in METADATA_OPS:
            continue
        by_namespace.setdefault(op.namespace, []).append(
            (_qualname(op), opspec.spec(op), masks.get(op)))
    for namespace, ops in by_namespace.items():
        executor._native.register_op_kernels(namespace, ops)
    fallback_lib.fallback(_taking_turns(fallback.run))
    # Sparse tensors (eager/sparse.py): their ops on the CPU, some kernels as they are
    on_cpu = _taking_turns(fallback.cpu_fallback)
    _sparse_libs[:] = sparse.install(on_cpu)
    for key in sparse.DEVICE_GENERIC:
        fallback_lib.fallback(lambda op, *args, **kwargs: on_cpu(op, args, kwargs), key)


_sparse_libs: list = []  # keeps the sparse keys' kernels registered


def _taking_turns(kernel):
    """`kernel` holding the op lock, as the native kernel of lowered ops does
    (runtime/native/shim.h): one op at a time in the process, threads take turns."""
    lock, unlock = executor._native.lock_ops, executor._native.unlock_ops

    @functools.wraps(kernel)
    def locked(*args, **kwargs):
        lock()
        try:
            return kernel(*args, **kwargs)
        finally:
            unlock()

    return locked


def _suffix(op) -> str:
    return "" if op._overloadname == "default" else "." + op._overloadname


def _qualname(op) -> str:
    return op._schema.name.split("::")[1] + _suffix(op)
