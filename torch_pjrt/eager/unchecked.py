"""Index arguments that PyTorch's CPU (and CUDA) kernels read unchecked, checked on the host
copies of a CPU-fallback op's arguments before the CPU kernel runs.

A CPU kernel that reads memory at an index it never checks gives whatever lies there (or
writes there): not a result pjrt may return. Where such an op runs on the CPU for pjrt, its
index arguments are checked here first, and a bad one raises at the op, as a device-side
assert would. An op lowered to XLA checks the same in its lowering (lowering/checks.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _ctc_targets(log_probs: torch.Tensor, targets: torch.Tensor, target_lengths) -> None:
    """CTC reads log_probs at each target label (the first target_lengths[i] of row i, or of
    the concatenated targets): a label outside log_probs' classes is read unchecked."""
    classes = log_probs.shape[-1]
    lengths = (target_lengths.tolist() if isinstance(target_lengths, torch.Tensor)
               else list(target_lengths))
    if targets.dim() == 1:
        used = targets[:max(0, min(sum(max(n, 0) for n in lengths), targets.numel()))]
    else:  # padded (batch, longest): the padding is never read
        used = torch.cat([row[:max(0, min(n, row.numel()))]
                          for row, n in zip(targets.reshape(len(lengths), -1), lengths)])
    bad = (used < 0) | (used >= classes)
    if bool(bad.any()):
        raise RuntimeError(f"ctc_loss: target {int(used[bad][0])} is out of bounds for "
                           f"{classes} classes (log_probs' last dimension)")


def _ctc(values: list) -> None:
    _ctc_targets(values[0], values[1], values[3])


def _ctc_backward(values: list) -> None:
    _ctc_targets(values[1], values[2], values[4])


# op name -> check of its arguments (schema order, on the host)
CHECKS: dict[str, Callable[[list], None]] = {
    "aten._ctc_loss.default": _ctc,
    "aten._ctc_loss.Tensor": _ctc,
    "aten._ctc_loss_backward.default": _ctc_backward,
    "aten._ctc_loss_backward.Tensor": _ctc_backward,
}
