"""Eager kernels for data-dependent shapes: nonzero, boolean-mask indexing.

The count of nonzeros is read from the device (a synchronization point, as on
CUDA); the program that produces the indices is compiled per power-of-two
bucket of that count, not per count.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _bucket(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def nonzero(x: torch.Tensor) -> torch.Tensor:
    count = int(aten.count_nonzero.default(x).item()) if x.dim() else int(bool(x.item()))
    padded = torch.ops.pjrt.nonzero_padded(x, _bucket(count))
    return padded[:count]


def _expand_masks(indices) -> list:
    """Boolean (and uint8) index tensors become their nonzero coordinates, as PyTorch does."""
    out = []
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            coords = nonzero(i)
            out.extend(coords.unbind(1) if i.dim() else [coords.reshape(-1)])
        else:
            out.append(i)
    return out


def _has_mask(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def make_index(execute_index):
    def index(x, indices):
        if _has_mask(indices):
            indices = _expand_masks(indices)
        return execute_index(x, indices)

    return index


def make_index_put(execute):
    def index_put(x, indices, values, accumulate=False, unsafe=False):
        if _has_mask(indices):
            indices = _expand_masks(indices)
        return execute(x, indices, values, accumulate)

    return index_put


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x, mask = torch.broadcast_tensors(x, mask)
    return x[mask]
