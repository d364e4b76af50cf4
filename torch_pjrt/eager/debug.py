"""Debug eager mode: each op runs synchronously and is checked where it happens.

Device-side errors (an index out of range) raise at the op that caused them.
With TORCH_PJRT_DEBUG_COMPARE=1 every op is also run on the CPU and compared,
so the first op whose result diverges is named.
"""

from __future__ import annotations

import torch

from .. import _env
from ..lowering import checks


def after_op(spec, call, results) -> None:
    for r in results:
        if hasattr(r, "block_until_ready"):
            r.block_until_ready()
    checks.raise_pending()


def compare_enabled() -> bool:
    return _env.flag("TORCH_PJRT_DEBUG_COMPARE")


def compare_with_cpu(op, args: tuple, kwargs: dict, result) -> None:
    """Run `op` on CPU copies of the inputs and raise if the pjrt result differs."""
    from torch.utils._pytree import tree_map

    pjrt = torch._C._get_privateuse1_backend_name()

    def cpu(x):
        return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == pjrt else x

    expected = op(*tree_map(cpu, args), **tree_map(cpu, kwargs))
    actual = tree_map(cpu, result)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-4, rtol=1e-4,
                                   check_device=False)
    except AssertionError as e:
        raise RuntimeError(f"pjrt debug: {op} diverges from CPU PyTorch: {e}") from None
