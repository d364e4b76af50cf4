"""PyTorch's OpInfo samples run on CPU and on pjrt, compared forward and backward."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from helpers import assert_as_accurate_as_cpu, assert_same, float64, spread_samples, to_device
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt


@functools.cache
def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {(o.name, o.variant_test_name): o for o in op_db}


def opinfo(name: str, variant: str = ""):
    return _op_db()[(name, variant)]


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _grad_outputs(out) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.requires_grad and t.dtype.is_floating_point]


def _backward(out, cotangents, leaves):
    outs = _grad_outputs(out)
    if not outs or not leaves:
        return None
    loss = sum((o * c.to(o.device)).sum() for o, c in zip(outs, cotangents))
    return torch.autograd.grad(loss, leaves, allow_unused=True)


# Default tolerances by dtype (as torch.testing), for forward results; gradients get 10x.
TOLERANCES = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)}


def check_samples(name: str, variant: str = "", *, dtypes=(torch.float32,), grad: bool = True,
                  check: Callable | None = None, skip: Callable | None = None,
                  atol: float | None = None, rtol: float | None = None,
                  accuracy: bool = False, grad_atol: float = 0.0) -> int:
    """Every OpInfo sample of the op on pjrt equals CPU (and so do the input gradients);
    `check(actual, expected, sample)` replaces the plain comparison. `accuracy`: results
    and gradients are held to be as accurate as the CPU's against the op run on float64
    copies of the sample (tests/tolerance.py), for ops of many roundings (attention,
    normalizations); `grad_atol` widens the gradients' accuracy bound by an absolute error
    the caller derives, for gradients that cancel to near zero, where the CPU's own error
    is luck of rounding and not a bound. Returns the count."""
    info = opinfo(name, variant)
    n = 0
    default_atol, default_rtol = atol, rtol
    for dtype in dtypes:
        atol, rtol = TOLERANCES.get(dtype, (1e-5, 1.3e-6))
        atol = default_atol if default_atol is not None else atol
        rtol = default_rtol if default_rtol is not None else rtol
        wants_grad = grad and info.supports_autograd and dtype.is_floating_point
        samples = info.sample_inputs("cpu", dtype, requires_grad=wants_grad)
        for sample in spread_samples(samples):
            if skip is not None and skip(sample):
                continue
            n += 1
            args = (sample.input, *sample.args)
            expected = info.op(*args, **sample.kwargs)
            dev_args, dev_kwargs = to_device(args), to_device(sample.kwargs)
            actual = info.op(*dev_args, **dev_kwargs)
            expected_p = sample.output_process_fn_grad(expected)
            actual_p = sample.output_process_fn_grad(actual)
            wide_args, wide_kwargs = (float64(args), float64(sample.kwargs)) if accuracy \
                else (None, None)
            if check is not None:
                check(actual, expected, sample)
            elif accuracy:
                reference = info.op(*wide_args, **wide_kwargs)
                assert_as_accurate_as_cpu(_floats(actual), _floats(expected), _floats(reference))
            else:
                assert_same(actual, expected, atol=atol, rtol=rtol)
            if not wants_grad:
                continue
            leaves = [t for t in _tensors(args) if t.requires_grad]
            dev_leaves = [t for t in _tensors(dev_args) if t.requires_grad]
            cot = [torch.randn_like(o.detach()) for o in _grad_outputs(expected_p)]
            g_cpu = _backward(expected_p, cot, leaves)
            if g_cpu is None:
                continue
            g_dev = _backward(actual_p, cot, dev_leaves)
            if accuracy:
                wide_leaves = [t for t in _tensors(wide_args) if t.requires_grad]
                wide_out = sample.output_process_fn_grad(info.op(*wide_args, **wide_kwargs))
                g_wide = _backward(wide_out, [c.double() for c in cot], wide_leaves)
                for a, e, r in zip(g_dev, g_cpu, g_wide):
                    if e is not None:
                        assert_as_accurate_as_cpu(a, e, r, atol=grad_atol)
                continue
            for a, e in zip(g_dev, g_cpu):
                if e is None:
                    continue
                assert_same(a, e, atol=atol * 10, rtol=rtol * 10)
    return n


def _floats(out) -> list:
    """The floating-point tensors of an op's result, in order (what accuracy compares)."""
    return [t for t in _tensors(out) if t.is_floating_point()]


def fallbacks_of(names) -> dict:
    """The CPU fallbacks so far among ops whose name contains one of `names`."""
    return {k: v for k, v in torch_pjrt.metrics()["cpu_fallbacks"].items()
            if any(n in k for n in names)}


def cpu_tree(tree):
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, tree)


# Eager kernels for ops with data-dependent output shapes (torch_pjrt.eager.dynamic) that
# eager/dispatch.py registers; installed here too while it does not yet.
DYNAMIC_KERNELS = {
    "_unique2": "unique2", "_unique": "unique", "unique_consecutive": "unique_consecutive",
    "unique_dim": "unique_dim", "unique_dim_consecutive": "unique_dim_consecutive",
    "bincount": "bincount", "repeat_interleave.Tensor": "repeat_interleave",
}
_libs: list = []


def install_dynamic_kernels() -> None:
    from torch_pjrt.eager import dynamic

    torch_pjrt.ensure_initialized()  # dispatch.install first: its registrations win
    lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    for name, fn in DYNAMIC_KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "PrivateUse1"):
            lib.impl(name, getattr(dynamic, fn))
    _libs.append(lib)
