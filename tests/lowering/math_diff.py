"""Differential helpers for the math families (elementwise, special, reductions, linalg, fft).

`check_opinfo` runs PyTorch's OpInfo samples of an op on CPU and pjrt for every dtype
the CPU supports among the ones asked for, compares forward results and input
gradients, and fails if any aten op fell back to the CPU along the way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from helpers import assert_same, spread_samples, to_device
from opinfo_diff import opinfo
from torch.utils._pytree import tree_flatten

import torch_pjrt

FLOAT_DTYPES = (torch.float32, torch.float64)
ALL_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64)


def tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.float64, torch.complex128):
        return {"atol": 1e-7, "rtol": 1e-7}
    return {"atol": 1e-5, "rtol": 1.3e-6}


def fallbacks() -> dict:
    return dict(torch_pjrt.metrics()["cpu_fallbacks"])


def new_fallbacks(before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in fallbacks().items() if v != before.get(k, 0)}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _differentiable(out) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.requires_grad and (t.dtype.is_floating_point
                                                             or t.dtype.is_complex)]


def _grads(outs, cotangents, leaves):
    if not outs or not leaves:
        return None
    return torch.autograd.grad(outs, leaves, [c.to(o.device) for o, c in zip(outs, cotangents)],
                               allow_unused=True)


def check_opinfo(name: str, variant: str = "", *, dtypes=ALL_DTYPES, grad: bool = True,
                 reference: bool = False, check: Callable | None = None,
                 skip: Callable | None = None, scale: float = 1.0,
                 allowed_fallbacks: tuple[str, ...] = ()) -> int:
    """OpInfo samples (with reference=True the larger edge-value set) on pjrt equal the CPU
    forward, and backward for real floating dtypes. `check(actual, expected, sample)` replaces
    the comparison; `scale` widens the tolerance. Returns the number of samples run."""
    info = opinfo(name, variant)
    supported = info.supported_dtypes("cpu")
    before = fallbacks()
    n = 0
    for dtype in dtypes:
        if dtype not in supported:
            continue
        tol = {k: v * scale for k, v in tolerance(dtype).items()}
        # Complex backward formulas go through conjugate views, which the executor does
        # not read conjugated yet: gradients are checked for real dtypes.
        wants_grad = grad and info.supports_autograd and dtype.is_floating_point
        make = info.reference_inputs if reference else info.sample_inputs
        for sample in spread_samples(make("cpu", dtype, requires_grad=wants_grad)):
            if skip is not None and skip(sample):
                continue
            args = (sample.input, *sample.args)
            try:
                expected = info.op(*args, **sample.kwargs)
            except Exception:  # noqa: BLE001 - the CPU rejects it; pjrt must too
                dev_args, dev_kwargs = to_device(args), to_device(sample.kwargs)
                try:
                    info.op(*dev_args, **dev_kwargs)
                except Exception:  # noqa: BLE001
                    continue
                raise AssertionError(f"{name}: CPU raised but pjrt did not on {sample}") \
                    from None
            n += 1
            dev_args, dev_kwargs = to_device(args), to_device(sample.kwargs)
            actual = info.op(*dev_args, **dev_kwargs)
            if check is not None:
                check(actual, expected, sample)
            else:
                assert_same(actual, expected, **tol)
            if not wants_grad:
                continue
            outs = _differentiable(sample.output_process_fn_grad(expected))
            dev_outs = _differentiable(sample.output_process_fn_grad(actual))
            leaves = [t for t in _tensors(args) if t.requires_grad]
            dev_leaves = [t for t in _tensors(dev_args) if t.requires_grad]
            cotangents = [torch.randn_like(o.detach()) for o in outs]
            g_cpu = _grads(outs, cotangents, leaves)
            if g_cpu is None:
                continue
            g_dev = _grads(dev_outs, cotangents, dev_leaves)
            for a, e in zip(g_dev, g_cpu):
                if e is not None:
                    assert_same(a, e, atol=tol["atol"] * 10, rtol=tol["rtol"] * 10)
    extra = {k: v for k, v in new_fallbacks(before).items()
             if not any(a in k for a in allowed_fallbacks)}
    assert not extra, f"{name}: ops ran on the CPU: {extra}"
    return n
