"""torch_pjrt.kernels: JAX functions as PyTorch operators, eager, compiled and differentiated."""

import jax
import jax.numpy as jnp
import torch

import torch_pjrt


@torch_pjrt.kernels.jax_op("pjrt_test::swish", "(Tensor x, float beta) -> Tensor")
def swish(x, beta):
    return x * jax.nn.sigmoid(beta * x)


@torch_pjrt.kernels.jax_op("pjrt_test::norm_and_sum", "(Tensor a, Tensor b) -> (Tensor, Tensor)")
def norm_and_sum(a, b):
    return jnp.sqrt(jnp.sum(a * a, axis=-1)), a + b


def test_forward_and_backward_on_cpu_and_pjrt():
    x = torch.randn(6, requires_grad=True)
    d = x.detach().to("pjrt").requires_grad_()
    torch.ops.pjrt_test.swish(x, 1.5).sum().backward()
    torch.ops.pjrt_test.swish(d, 1.5).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)
    ref = x.detach() * torch.sigmoid(1.5 * x.detach())
    torch.testing.assert_close(torch.ops.pjrt_test.swish(d, 1.5).detach().cpu(), ref)
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {}


def test_several_outputs_and_gradients():
    a, b = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    da, db = (t.detach().to("pjrt").requires_grad_() for t in (a, b))
    for x, y in ((a, b), (da, db)):
        n, s = torch.ops.pjrt_test.norm_and_sum(x, y)
        (n.sum() + (s * s).sum()).backward()
    torch.testing.assert_close(da.grad.cpu(), a.grad)
    torch.testing.assert_close(db.grad.cpu(), b.grad)


def test_lowered_inside_compiled_graphs():
    torch._dynamo.reset()
    torch_pjrt.counters.reset()
    fn = torch.compile(lambda t: torch.ops.pjrt_test.swish(t, 2.0) * 2, backend="pjrt")
    x = torch.randn(8)
    torch.testing.assert_close(fn(x.to("pjrt")).cpu(), 2 * x * torch.sigmoid(2 * x))
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 1 and m.get("compile_eager_graphs", 0) == 0
