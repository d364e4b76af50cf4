"""No pjrt kernel takes the place of a decomposition autograd relies on: an op PyTorch
decomposes before autograd (CompositeImplicitAutograd without an autograd kernel) that has a
PrivateUse1 kernel would run that kernel under autograd's not-implemented fallback, and its
inputs' gradients would be None (aten._convolution.deprecated's were)."""

import torch
from helpers import compare_products

import torch_pjrt  # noqa: F401

aten = torch.ops.aten
has = torch._C._dispatch_has_kernel_for_dispatch_key
# Metadata-only kernels over the CPU's (eager/dispatch.py METADATA_OPS) and the shim's
# shallow-copy rule: their composites are views or checks, checked by the gradient below.
ALLOWED = {"aten::swapdims_", "aten::swapaxes_", "aten::_has_compatible_shallow_copy_type"}


def test_no_pjrt_kernel_hides_a_composite_from_autograd():
    torch.empty(1, device="pjrt")  # registers every kernel
    cut = [name for name in torch._C._dispatch_get_all_op_names()
           if has(name, "PrivateUse1") and has(name, "CompositeImplicitAutograd")
           and not has(name, "Autograd") and not has(name, "AutogradPrivateUse1")
           and name not in ALLOWED]
    assert not cut, f"pjrt kernels that cut autograd: {cut}"


def test_deprecated_convolution_overload_has_gradients():
    x, w, b = torch.randn(2, 4, 8, 9), torch.randn(6, 2, 3, 3), torch.randn(6)
    compare_products(lambda x, w, b: aten._convolution.deprecated(
        x, w, b, [2, 3], [1, 1], [2, 1], False, [0, 0], 2, False, False, True), x, w, b)


def test_in_place_swapdims_keeps_its_gradient():
    x = torch.randn(2, 3, 4)
    grads = []
    for device in ("cpu", "pjrt"):
        leaf = x.to(device, copy=True).requires_grad_()
        y = leaf * 2
        y.swapdims_(0, 1).swapaxes_(1, 2)
        (y * torch.arange(24.0, device=device).view(3, 4, 2)).sum().backward()
        grads.append(leaf.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
