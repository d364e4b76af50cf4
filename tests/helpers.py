"""Differential testing: run the same code on CPU PyTorch and on pjrt, compare."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

DEVICE = "pjrt"


def to_device(tree: Any, device: str = DEVICE) -> Any:
    """Every tensor in `tree` copied to `device` (requires_grad kept, as a leaf)."""

    def move(x):
        if isinstance(x, torch.Tensor):
            y = x.detach().to(device)
            return y.requires_grad_(x.requires_grad)
        return x

    return tree_map(move, tree)


def to_cpu(tree: Any) -> Any:
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, tree)


def assert_same(actual: Any, expected: Any, *, atol: float = 1e-5, rtol: float = 1.3e-6,
                exact_dtype: bool = True) -> None:
    """pjrt result(s) equal the CPU result(s): values, shapes, dtypes (and device is pjrt)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == DEVICE, f"result on {actual.device}, expected pjrt"
        torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol,
                                   equal_nan=True, check_dtype=exact_dtype)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol=atol, rtol=rtol, exact_dtype=exact_dtype)
    else:
        assert actual == expected, f"{actual!r} != {expected!r}"


def compare(fn: Callable, *args, atol: float = 1e-5, rtol: float = 1.3e-6, **kwargs) -> Any:
    """fn(*args) on CPU and on pjrt give the same result; returns the pjrt result."""
    expected = fn(*args, **kwargs)
    actual = fn(*to_device(args), **to_device(kwargs))
    assert_same(actual, expected, atol=atol, rtol=rtol)
    return actual
