"""register_jax: JAX kernels for torch.library operators, checked with torch.library.opcheck
in every eager mode, under torch.compile(fullgraph=True), with autograd and mutation."""

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_pjrt
from torch_pjrt.kernels import register_jax

NS = "pjrt_test_rj"
# PyTorch's test_autograd_registration knows only cpu/cuda/xpu tensors (it raises
# NotImplementedError for any other device once an input requires grad); with such
# inputs the registration is checked by test_autograd_kernel_is_registered below.
WITH_GRAD = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


# ------------------------------------------------------------------ the operators
@torch.library.custom_op(f"{NS}::swish", mutates_args=())
def swish(x: torch.Tensor, w: torch.Tensor, beta: float) -> torch.Tensor:
    return x * torch.sigmoid(beta * x) * w


@swish.register_fake
def _(x, w, beta):
    return torch.empty_like(x)


@register_jax(swish)
def swish_jax(x, w, beta):
    return x * jax.nn.sigmoid(beta * x) * w


@torch.library.custom_op(f"{NS}::norm_and_sum", mutates_args=())
def norm_and_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.norm(dim=-1), a + b


@norm_and_sum.register_fake
def _(a, b):
    return a.new_empty(a.shape[:-1]), torch.empty_like(a)


register_jax(norm_and_sum, lambda a, b: (jnp.sqrt(jnp.sum(a * a, axis=-1)), a + b))


@torch.library.custom_op(f"{NS}::clip_grad_identity", mutates_args=())
def clip_grad_identity(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def _clip_setup(ctx, inputs, output):
    pass


def _clip_backward(ctx, grad):  # the author's formula: not the JAX function's derivative
    return grad.clamp(-0.5, 0.5)


clip_grad_identity.register_autograd(_clip_backward, setup_context=_clip_setup)
register_jax(clip_grad_identity, lambda x: x * 1)


@torch.library.custom_op(f"{NS}::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return x ** 3


register_jax(cube, lambda x: x ** 3)  # no fake: jax.eval_shape's

torch.library.define(f"{NS}::rowmax_and_arg", "(Tensor x, int dim) -> (Tensor, Tensor)")
register_jax(f"{NS}::rowmax_and_arg",
             lambda x, dim: (jnp.max(x, axis=dim), jnp.argmax(x, axis=dim).astype(jnp.int64)))


@torch.library.custom_op(f"{NS}::add_into", mutates_args=("acc",))
def add_into(acc: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
    acc.add_(x, alpha=alpha)


register_jax(add_into, lambda acc, x, alpha: acc + alpha * x)


@torch.library.custom_op(f"{NS}::scale_and_sum", mutates_args=("x",))
def scale_and_sum(x: torch.Tensor, s: float) -> torch.Tensor:
    x.mul_(s)
    return x.sum()


@scale_and_sum.register_fake
def _(x, s):
    return x.new_empty(())


register_jax(scale_and_sum, lambda x, s: (x * s, jnp.sum(x * s)))

ops = torch.ops.pjrt_test_rj


def _pjrt(*ts, grad=False):
    return [t.detach().to("pjrt").requires_grad_(grad) for t in ts]


# ------------------------------------------------------------------ opcheck
@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_opcheck_every_mode(mode):
    x, w, a = torch.randn(3, 5), torch.randn(5), torch.randn(4, 5)
    with torch_pjrt.set_eager_mode(mode):
        cases = [(ops.swish.default, (*_pjrt(x, w), 1.5)),
                 (ops.norm_and_sum.default, tuple(_pjrt(a, a + 1))),
                 (ops.cube.default, tuple(_pjrt(x))),
                 (ops.rowmax_and_arg.default, (*_pjrt(a), 1)),
                 (ops.add_into.default, (*_pjrt(a, a * 2), 0.5)),
                 (ops.scale_and_sum.default, (*_pjrt(a), 3.0))]
        for op, args in cases:
            torch.library.opcheck(op, args)
        for op, args in cases[:3]:  # differentiable: the same with gradients
            grad_args = tuple(t.detach().requires_grad_() if isinstance(t, torch.Tensor)
                              else t for t in args)
            torch.library.opcheck(op, grad_args, test_utils=WITH_GRAD)
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


def test_autograd_kernel_is_registered():
    """What test_autograd_registration checks for cpu and cuda, for pjrt: the op has an
    autograd kernel for the device's autograd key (or the Autograd alias)."""
    for op in (ops.swish.default, ops.norm_and_sum.default, ops.cube.default,
               ops.rowmax_and_arg.default, ops.clip_grad_identity.default):
        assert any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
                   for key in ("AutogradPrivateUse1", "Autograd")), op


# ------------------------------------------------------------------ values and gradients
@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_forward_and_vjp_gradients_against_cpu(mode):
    x, w = torch.randn(3, 5, requires_grad=True), torch.randn(5, requires_grad=True)
    (x * torch.sigmoid(1.5 * x) * w).sum().backward()  # the CPU reference
    a = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(4, 5, requires_grad=True)
    n, s = a.norm(dim=-1), a + b
    (n.sum() + (s * s).sum()).backward()
    with torch_pjrt.set_eager_mode(mode):
        dx, dw = _pjrt(x, w, grad=True)
        ops.swish(dx, dw, 1.5).sum().backward()
        da, db = _pjrt(a, b, grad=True)
        dn, ds = ops.norm_and_sum(da, db)
        (dn.sum() + (ds * ds).sum()).backward()
        torch.testing.assert_close(dx.grad.cpu(), x.grad)
        torch.testing.assert_close(dw.grad.cpu(), w.grad)
        torch.testing.assert_close(da.grad.cpu(), a.grad)
        torch.testing.assert_close(db.grad.cpu(), b.grad)
        torch.testing.assert_close(dn.detach().cpu(), n.detach())
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


def test_integer_outputs_and_eval_shape_fake():
    x = torch.randn(4, 6, requires_grad=True)
    m, i = x.max(dim=1)
    m.sum().backward()
    d = x.detach().to("pjrt").requires_grad_()
    dm, di = ops.rowmax_and_arg(d, 1)
    assert di.dtype == torch.int64 and dm.shape == (4,)
    dm.sum().backward()
    torch.testing.assert_close(di.cpu(), i)
    torch.testing.assert_close(d.grad.cpu(), x.grad)
    with torch._subclasses.FakeTensorMode():  # jax.eval_shape's fake implementation
        y = ops.cube(torch.empty(2, 7))
    assert y.shape == (2, 7) and y.dtype == torch.float32


def test_authors_formula_wins_also_when_registered_later():
    x = torch.tensor([-2.0, 0.25, 3.0])
    d = x.to("pjrt").requires_grad_()
    (ops.clip_grad_identity(d) * 4).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), torch.full((3,), 0.5))

    @torch.library.custom_op(f"{NS}::late", mutates_args=())
    def late(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    register_jax(late, lambda x: x * 2)
    d = x.to("pjrt").requires_grad_()
    late(d).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), torch.full((3,), 2.0))  # jax.vjp
    late.register_autograd(lambda ctx, g: g * 10, setup_context=lambda ctx, inputs, output: None)
    d = x.to("pjrt").requires_grad_()
    late(d).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), torch.full((3,), 10.0))  # the author's


# ------------------------------------------------------------------ mutation
@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_mutating_ops_write_through_views(mode):
    acc, x = torch.randn(4, 3), torch.randn(4, 3)
    with torch_pjrt.set_eager_mode(mode):
        a = acc.to("pjrt")
        assert ops.add_into(a[1:3], x[1:3].to("pjrt"), 2.0) is None
        b = a.t()
        total = ops.scale_and_sum(b, 0.5)
        expected = acc.clone()
        expected[1:3] += 2 * x[1:3]
        torch.testing.assert_close(total.cpu(), expected.sum() * 0.5)
        expected *= 0.5
        torch.testing.assert_close(a.cpu(), expected)


def test_mutating_ops_compiled_fullgraph():
    torch._dynamo.reset()

    def f(acc, x):
        ops.add_into(acc[1:], x[1:], 3.0)  # a view of an input
        y = acc * 2
        s = ops.scale_and_sum(y, 0.5)  # an intermediate
        return y, s

    acc, x = torch.randn(4, 3), torch.randn(4, 3)
    expected_acc = acc.clone()
    expected = f(expected_acc, x)
    a = acc.to("pjrt")
    out = torch.compile(f, backend="pjrt", fullgraph=True)(a, x.to("pjrt"))
    torch.testing.assert_close(a.cpu(), expected_acc)
    torch.testing.assert_close(out[0].cpu(), expected[0])
    torch.testing.assert_close(out[1].cpu(), expected[1])
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 1 and m.get("compile_eager_graphs", 0) == 0


# ------------------------------------------------------------------ torch.compile
def test_compiled_fullgraph_forward_and_backward():
    torch._dynamo.reset()

    def f(x, w):
        y = ops.swish(x, w, 2.0)
        n, s = ops.norm_and_sum(y, x)
        return (n.sum() + s.square().sum()) * ops.cube(w).sum()

    x, w = torch.randn(3, 5), torch.randn(5)
    eager_args = _pjrt(x, w, grad=True)
    f(*eager_args).backward()
    args = _pjrt(x, w, grad=True)
    loss = torch.compile(f, backend="pjrt", fullgraph=True)(*args)
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), f(*_pjrt(x, w)).cpu())
    for a, e in zip(args, eager_args):
        torch.testing.assert_close(a.grad.cpu(), e.grad.cpu())
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 2 and m.get("compile_eager_graphs", 0) == 0  # fwd, bwd


# ------------------------------------------------------------------ errors
def test_a_wrong_output_shape_raises_naming_the_op():
    @torch.library.custom_op(f"{NS}::wrong", mutates_args=())
    def wrong(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @wrong.register_fake
    def _(x):
        return torch.empty_like(x)

    register_jax(wrong, lambda x: jnp.sum(x, axis=0))  # [5] where the fake says [3, 5]
    with pytest.raises(RuntimeError, match=r"wrong.*float32\[5\].*float32\[3, 5\]"):
        wrong(torch.randn(3, 5, device="pjrt")).cpu()


def test_registration_errors():
    with pytest.raises(ValueError, match="already has a pjrt kernel"):
        register_jax(swish, swish_jax)
    with pytest.raises(TypeError, match="expected an operator"):
        register_jax(len, swish_jax)
    with pytest.raises(ValueError, match="no operator"):
        register_jax(f"{NS}::missing", swish_jax)
