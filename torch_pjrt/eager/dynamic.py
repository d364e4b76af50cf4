"""Eager kernels for data-dependent shapes: nonzero, boolean-mask indexing.

The count of nonzeros is read from the device (a synchronization point, as on
CUDA); the program that produces the indices is compiled per power-of-two
bucket of that count, not per count.
"""

from __future__ import annotations

import warnings

import torch

from .. import _compat

aten = torch.ops.aten


def _bucket(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _coords(x: torch.Tensor) -> torch.Tensor:
    """The nonzeros' coordinates, (count, x.dim()): the leading rows of a padded result."""
    count = int(aten.count_nonzero.default(x).item()) if x.dim() else int(bool(x.item()))
    padded = torch.ops.pjrt.nonzero_padded(x, _bucket(count))
    return padded[:count]


def nonzero(x: torch.Tensor) -> torch.Tensor:
    """aten.nonzero: in the layout the CPU and CUDA kernels give, column-major (strides
    (1, count))."""
    coords = _coords(x)
    out = torch.empty_strided(coords.shape, (1, coords.shape[0]), dtype=coords.dtype,
                              device=coords.device)
    return out.copy_(coords)


def _device_indices(x: torch.Tensor, indices) -> list:
    """Indices as the lowering takes them: on x's device (PyTorch takes CPU indices into a
    tensor on any device), and boolean (and uint8) masks as their nonzero coordinates."""
    out, dim = [], 0
    for i in indices:
        if i is not None and i.device != x.device:
            i = i.to(x.device)
        if i is not None and i.dtype in _MASK_DTYPES:
            if i.dtype == torch.uint8:  # (the CPU's and CUDA's warning, each call)
                warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use "
                              "a dtype torch.bool instead.", UserWarning, stacklevel=4)
            _check_mask_shape(x, i, dim)
            coords = _coords(i)
            out.extend(coords.unbind(1) if i.dim() else [coords.reshape(-1)])
            dim += i.dim()
        else:
            out.append(i)
            dim += 1
    return out


def _check_mask_shape(x: torch.Tensor, mask: torch.Tensor, dim: int) -> None:
    """A mask indexing x from dimension `dim` must have the shape of those dimensions (the
    CPU's IndexError; its nonzero coordinates would index past them, or fewer of them)."""
    for j, n in enumerate(mask.shape):
        if dim + j >= x.dim() or n != x.shape[dim + j]:
            raise IndexError(f"The shape of the mask {list(mask.shape)} at index {j} does not "
                             f"match the shape of the indexed tensor {list(x.shape)} at index "
                             f"{dim + j}")


_MASK_DTYPES = (torch.bool, torch.uint8)


def _has_mask(indices) -> bool:
    """Whether an index is a mask or on the CPU (op_kernel.cpp's has_mask decides the same
    for the native kernel: keep the two alike)."""
    for i in indices:  # a loop, not any(): this runs on every indexing op
        if i is not None and (i.dtype in _MASK_DTYPES or i.device.type == "cpu"):
            return True
    return False


def make_index(execute_index):
    def index(x, indices):
        if _has_mask(indices):
            indices = _device_indices(x, indices)
        return execute_index(x, indices)

    return index


def _one_bool_mask(x, indices):
    """The mask of `x[mask] = value` that PyTorch runs as masked_fill_ (one boolean mask on
    x's device, the other indices None), unsqueezed over the dimensions after it; else None.
    (CPU PyTorch does so for a one-element value, whatever its dtype, and then checks no
    overlap between value and x; CUDA only for a CPU value.)"""
    mask, dim, end = None, 0, 0
    for i in indices:
        if i is None:
            dim += 1
            continue
        if mask is not None or i.dtype != torch.bool or i.device != x.device:
            return None
        _check_mask_shape(x, i, dim)
        mask, dim = i, dim + i.dim()
        end = dim  # the dimensions after the mask, listed as None or not, broadcast over
    if mask is None:
        return None
    return mask.reshape(*mask.shape, *[1] * (x.dim() - end)) if x.dim() > end else mask


def make_index_put(execute, inplace: bool):
    def index_put(x, indices, values, accumulate=False, unsafe=False):
        if _has_mask(indices):
            mask = None
            if not accumulate and values.numel() == 1:
                mask = _one_bool_mask(x, indices)
            if mask is not None:  # (a device value stays there: no synchronization)
                value = values.item() if values.device.type == "cpu" else values.reshape(())
                return x.masked_fill_(mask, value) if inplace else x.masked_fill(mask, value)
            indices = _device_indices(x, indices)
        return execute(x, indices, values, accumulate)

    return index_put


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # the CPU kernel's check: x[mask] would read an integer mask as indices (int64) or, with
    # a deprecation warning, as a mask (uint8)
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    x, mask = torch.broadcast_tensors(x, mask)
    return x[mask]


# ------------------------------------------------------------------- unique
def _empty_long(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,), dtype=torch.long)


def _unique_flat(x, consecutive, return_inverse, return_counts):
    values, inverse, counts, count = torch.ops.pjrt.unique_padded(x, consecutive)
    n = int(count.item())
    return (values[:n], inverse if return_inverse else _empty_long(x),
            counts[:n] if return_counts else _empty_long(x))


def unique2(x, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    """aten._unique2 (torch.unique without dim): always sorted, as PyTorch's CPU kernel."""
    return _unique_flat(x, False, return_inverse, return_counts)


def unique(x, sorted=True, return_inverse=False):  # noqa: A002
    """aten._unique (the legacy overload)."""
    return _unique_flat(x, False, return_inverse, False)[:2]


def _unique_along(x, dim, consecutive):
    dim = dim % max(x.dim(), 1)
    values, inverse, counts, count = torch.ops.pjrt.unique_dim_padded(x, dim, consecutive)
    n = int(count.item())
    return values.narrow(dim, 0, n), inverse, counts[:n]


def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return _unique_along(x, dim, True)
    return _unique_flat(x, True, return_inverse, return_counts)


def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    """PyTorch's CPU kernel returns the inverse and counts whether asked or not."""
    return _unique_along(x, dim, False)


def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    return _unique_along(x, dim, True)


# ------------------------------------------------------- bincount, repeat_interleave
def _bincount_dtype(weights: torch.Tensor) -> torch.dtype:
    return weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64


def bincount(x, weights=None, minlength=0):
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (weights.dim() != 1 or weights.numel() != x.numel()):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if x.numel() == 0:
        return torch.zeros((minlength,), dtype=torch.long, device=x.device)
    low, high = torch.stack([x.min(), x.max()]).cpu().tolist()
    if low < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    n = max(int(high) + 1, minlength)
    if weights is None:
        return torch.ops.pjrt.bincount_padded(x, _bucket(n))[:n]
    return torch.ops.pjrt.bincount_weighted_padded(x, weights, _bucket(n),
                                                   _bincount_dtype(weights))[:n]


def repeat_interleave(repeats, *, output_size=None):
    """aten.repeat_interleave.Tensor: the output length is sum(repeats), read from the device
    unless the caller gives it."""
    refused = _compat.repeat_interleave_refusal(repeats.dtype)
    if refused is not None:
        raise refused[0](refused[1])
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if output_size is not None:
        return torch.ops.pjrt.repeat_interleave_padded(repeats, output_size, output_size)
    if repeats.numel() == 0:
        return repeats.new_empty((0,))
    total, low = torch.stack([repeats.sum(), repeats.min().long()]).cpu().tolist()
    if low < 0:
        raise RuntimeError("repeats can not be negative")
    return torch.ops.pjrt.repeat_interleave_padded(repeats, _bucket(int(total)))[:total]
