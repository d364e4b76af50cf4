"""The autograd kernel of custom operators on pjrt, in C++ (runtime/native/op_kernel.cpp,
AutogradKernel): a call that records no gradient goes straight to the op's pjrt kernel,
as a built-in op's does, instead of through PyTorch's Python autograd kernel for custom
ops (torch._library.autograd), which cost 2.8-3.2x a built-in op per call in fused eager
(docs/benchmarks.md). A call that records gradients runs that Python kernel."""

from __future__ import annotations

from collections.abc import Callable

from .. import runtime
from . import library


def install(op: library.OpOverload, impl: Callable) -> None:
    """Register the C++ kernel as `op`'s AutogradPrivateUse1 kernel; `impl(keyset, *args,
    **keyword_only_args)` (make_autograd_impl's) records the gradient when one is needed."""
    keyword = [a.name for a in op._schema.arguments if a.kwarg_only]
    n_positional = len(op._schema.arguments) - len(keyword)
    slow = impl
    if keyword:
        def slow(keyset, *values):
            return impl(keyset, *values[:n_positional],
                        **dict(zip(keyword, values[n_positional:])))
    runtime.shim().register_autograd_kernel(op.namespace, library.name_in_namespace(op), slow)
