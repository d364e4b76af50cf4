"""Differential testing: run the same code on CPU PyTorch and on pjrt, compare."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

DEVICE = "pjrt"
# TORCH_PJRT_SLOW_TESTS=1: the long sweeps (every sample, dtype and variant) run too
SLOW_TESTS = os.environ.get("TORCH_PJRT_SLOW_TESTS", "").strip() not in ("", "0")


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


def assert_same(actual: Any, expected: Any, *, atol: float | None = None,
                rtol: float | None = None, scale: float = 1.0,
                exact_dtype: bool = True) -> None:
    """pjrt result(s) equal the CPU result(s): values, shapes, dtypes (and device is pjrt).

    Each tensor is held to tests/tolerance.py's `elementwise` bound for its own dtype (a
    list of float64, float32 and bfloat16 tensors: each to its rounding), `scale` times it
    for a computation of several roundings; an atol or rtol given replaces that part."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == DEVICE, f"result on {actual.device}, expected pjrt"
        from tolerance import elementwise

        tol = elementwise(expected.dtype, scale)
        tol.update({k: v for k, v in (("atol", atol), ("rtol", rtol)) if v is not None})
        torch.testing.assert_close(actual.cpu(), expected, **tol,
                                   equal_nan=True, check_dtype=exact_dtype)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol=atol, rtol=rtol, scale=scale, exact_dtype=exact_dtype)
    else:
        assert actual == expected, f"{actual!r} != {expected!r}"


def compare(fn: Callable, *args, atol: float | None = None, rtol: float | None = None,
            scale: float = 1.0, **kwargs) -> Any:
    """fn(*args) on CPU and on pjrt give the same result (assert_same's tolerance); returns
    the pjrt result."""
    expected = fn(*args, **kwargs)
    actual = fn(*to_device(args), **to_device(kwargs))
    assert_same(actual, expected, atol=atol, rtol=rtol, scale=scale)
    return actual


def float64(tree: Any) -> Any:
    """Every floating-point tensor in `tree` as a float64 copy (complex: complex128), with
    requires_grad kept: the inputs of a reference computation."""

    def widen(x):
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            wide = torch.complex128 if x.is_complex() else torch.float64
            return x.detach().to(wide).requires_grad_(x.requires_grad)
        return x

    return tree_map(widen, tree)


def assert_as_accurate_as_cpu(actual: Any, expected: Any, reference: Any, **bound) -> None:
    """Each pjrt result is about as close to the float64 `reference` as the CPU's `expected`
    (tests/tolerance.py's `assert_as_accurate`, `bound` its options): the promise for a
    computation of many roundings (attention, a layer, a network) on any processor."""
    from tolerance import assert_as_accurate

    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.device.type == DEVICE, actual
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
            (actual.dtype, expected.dtype, actual.shape, expected.shape)
        assert_as_accurate(actual.detach().cpu(), expected.detach(), reference.detach(),
                           **bound)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected) == len(reference)
        for i, (a, e, r) in enumerate(zip(actual, expected, reference)):
            if e is None:
                assert a is None, f"result {i}: pjrt computed one, the CPU none"
            else:
                assert_as_accurate_as_cpu(a, e, r, what=f"result {i}", **bound)
    else:
        assert actual == expected, f"{actual!r} != {expected!r}"


def outputs_and_grads(fn: Callable, *tensors: torch.Tensor, seed: int = 1) -> list:
    """fn's output and the gradients of its floating-point inputs, for a fixed random
    cotangent (the same on every device): what differential backward tests compare."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves)
    if not out.requires_grad:
        return [out]
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    out.backward(cot.to(out.device))
    return [out] + [t.grad for t in leaves if t.requires_grad]


def compare_products(fn: Callable, *tensors: torch.Tensor, roundings: int = 1) -> None:
    """`outputs_and_grads` of `fn`, linear in each input (products, convolutions, sums), on
    pjrt within what rounding allows of the CPU's: tests/tolerance.py's `sum_bound` over
    the terms' magnitudes (`roundings`: how often a kernel may round partial sums to a low-
    precision dtype)."""
    from tolerance import assert_within, product_magnitudes, sum_bound

    expected = outputs_and_grads(fn, *tensors)
    actual = outputs_and_grads(fn, *to_device(tensors))
    terms = max(t.numel() for t in tensors)
    magnitudes = product_magnitudes(fn, *tensors)
    assert len(actual) == len(expected) == len(magnitudes)
    for i, (a, e, m) in enumerate(zip(actual, expected, magnitudes)):
        if e is None:  # an input the op does not differentiate
            assert a is None, f"gradient {i}: pjrt computed one, the CPU none"
            continue
        assert a.device.type == DEVICE and a.dtype == e.dtype, (a.device, a.dtype, e.dtype)
        assert_within(a, e, sum_bound(m, e.dtype, roundings=roundings, terms=terms),
                      "output" if i == 0 else f"gradient {i}")


def spread_samples(samples: Any) -> list:
    """The CI slice of an op's OpInfo samples for one dtype: at most
    TORCH_PJRT_OPINFO_SAMPLES (default 4), spread over the list as the conformance sweep
    spreads them (its edge cases come last). TORCH_PJRT_SLOW_TESTS=1 keeps every one."""
    from torch_pjrt.conformance import spread

    if SLOW_TESTS:
        return list(samples)
    return spread(list(samples), int(os.environ.get("TORCH_PJRT_OPINFO_SAMPLES", "4")))


def pytest_without_cpu_kernels(test_file: str, select: str) -> str:
    """Run `test_file`'s tests matching `-k select` in a new process with
    TORCH_PJRT_CPU_KERNELS=0 (the lowerings' pure-XLA paths, what GPUs and TPUs run) and
    return its output; fails the calling test if any of them fails."""
    env = {**os.environ, "TORCH_PJRT_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p",
                          "no:xdist", "-p", "no:cacheprovider", test_file, "-k", select],
                         env=env, capture_output=True, text=True, timeout=900,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(test_file))))
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-500:]
    return out.stdout
