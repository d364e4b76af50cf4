"""_foreach_* ops (PyTorch's foreach OpInfo samples and mixed-dtype lists), against CPU."""

import functools

import pytest
import torch
from helpers import assert_same, compare, spread_samples, to_device
from opinfo_diff import fallbacks_of
from tolerance import assert_within, sum_bound


@functools.cache
def _foreach_db():
    from torch.testing._internal import common_methods_invocations as cmi

    dbs = ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db",
           "foreach_reduce_op_db", "foreach_other_op_db")
    return {o.name: o for db in dbs for o in getattr(cmi, db)}


NAMES = sorted(_foreach_db())
DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _escape(text):
    import re

    return re.escape(text)


def _run(fn, sample):
    return fn(sample.input, *sample.args, **sample.kwargs)


def _outputs(sample, result):
    """What a variant produces: its result, or the mutated self list for in-place ones."""
    return sample.input if result is None else result


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_foreach_opinfo(name, dtype):
    info = _foreach_db()[name]
    if dtype not in info.supported_dtypes("cpu"):
        pytest.skip(f"{name} does not support {dtype} on CPU")
    n = 0
    for sample in spread_samples(info.sample_inputs("cpu", dtype, num_input_tensors=[3])):
        variants = [info.op] + ([info.inplace_variant] if info.inplace_variant else [])
        for fn in variants:
            cpu_sample = sample.transform(lambda t: t.clone() if isinstance(t, torch.Tensor)
                                          else t)
            try:
                expected = _outputs(cpu_sample, _run(fn, cpu_sample))
            except Exception as e:  # noqa: BLE001 - the device must raise too
                # (pjrt reports errors raised while compiling as RuntimeError)
                with pytest.raises(RuntimeError if isinstance(e, RuntimeError) else type(e),
                                   match=_escape(str(e).splitlines()[0])):
                    dev = sample.transform(lambda t: to_device(t.clone())
                                           if isinstance(t, torch.Tensor) else t)
                    _outputs(dev, _run(fn, dev))
                    torch.pjrt.synchronize()
                n += 1
                continue
            dev = sample.transform(lambda t: to_device(t.clone())
                                   if isinstance(t, torch.Tensor) else t)
            actual = _outputs(dev, _run(fn, dev))
            if name == "_foreach_mm" and dtype.is_floating_point:  # sums of products (BLAS order)
                for a, e, x, y in zip(actual, expected, sample.input, sample.args[0]):
                    terms = x.abs().double() @ y.abs().double()
                    assert_within(a, e, sum_bound(terms, e.dtype, terms=x.shape[-1]))
            else:
                assert_same(actual, expected)
            n += 1
    assert n > 0
    assert not fallbacks_of(["_foreach"])


@pytest.mark.parametrize("name", ["_foreach_add", "_foreach_mul", "_foreach_exp",
                                  "_foreach_addcmul", "_foreach_lerp", "_foreach_norm",
                                  "_foreach_sqrt", "_foreach_pow"])
def test_foreach_gradients(name):
    info = _foreach_db()[name]
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=True,
                                     num_input_tensors=[2]):
        leaves = [t for t in sample.input if t.requires_grad]
        out = _run(info.op, sample)
        if not leaves or not all(o.requires_grad for o in out):
            continue
        cot = [torch.randn_like(o) for o in out]
        g_cpu = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out, cot)), leaves,
                                    allow_unused=True)
        dev = sample.transform(lambda t: to_device(t) if isinstance(t, torch.Tensor) else t)
        dev_leaves = [t for t in dev.input if t.requires_grad]
        out_d = _run(info.op, dev)
        g_dev = torch.autograd.grad(sum((o * c.to("pjrt")).sum() for o, c in zip(out_d, cot)),
                                    dev_leaves, allow_unused=True)
        for a, e in zip(g_dev, g_cpu):
            if e is not None:
                assert_same(a, e)


def _mixed():
    """A list like a real model's parameters: several shapes and dtypes, a 0-d and an empty."""
    torch.manual_seed(0)
    shapes = [(3, 4), (5,), (), (2, 0), (7, 1)]
    dtypes = [torch.float32, torch.bfloat16, torch.float64, torch.float32, torch.float16]
    return [torch.rand(s).add(0.5).to(d) for s, d in zip(shapes, dtypes)]


UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
         "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
         "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_mixed_dtypes_and_inplace(name):
    xs = _mixed()
    fn = getattr(torch, f"_foreach_{name}")
    fn_ = getattr(torch, f"_foreach_{name}_")
    compare(fn, xs)

    def inplace(xs):
        xs = [x.clone() for x in xs]
        fn_(xs)
        return xs

    compare(inplace, xs)


@pytest.mark.parametrize("name", ["abs", "neg", "sign", "ceil", "exp", "sqrt"])
def test_unary_integer_lists(name):
    xs = [torch.randint(-5, 5, (3,)), torch.randint(-5, 5, (2, 2)), torch.tensor(3)]
    compare(getattr(torch, f"_foreach_{name}"), xs)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum",
                                  "clamp_min", "clamp_max", "pow"])
@pytest.mark.parametrize("other", ["list", "scalar", "scalarlist", "tensor"])
def test_binary_overloads(name, other):
    if other == "tensor" and name not in ("add", "mul", "div"):
        pytest.skip("no Tensor overload")
    xs, ys = _mixed(), _mixed()
    operand = {"list": ys, "scalar": 1.5, "scalarlist": [1.5, 2, 0.5, 3.0, -1],
               "tensor": torch.tensor(3.0)}[other]
    fn = getattr(torch, f"_foreach_{name}")
    compare(fn, xs, operand)

    def inplace(xs, o):
        xs = [x.clone() for x in xs]
        getattr(torch, f"_foreach_{name}_")(xs, o)
        return xs

    compare(inplace, xs, operand)


def test_alpha_and_integer_promotion():
    xs, ys = _mixed(), _mixed()
    compare(lambda xs, ys: torch._foreach_add(xs, ys, alpha=0.3), xs, ys)
    compare(lambda xs, ys: torch._foreach_sub(xs, ys, alpha=2), xs, ys)
    ints = [torch.randint(-5, 5, (3,)), torch.randint(-5, 5, (2, 2))]
    compare(lambda xs: (torch._foreach_add(xs, 2), torch._foreach_add(xs, 2.5),
                        torch._foreach_div(xs, 2), torch._foreach_mul(xs, [2, 0.5])), ints)
    compare(lambda xs: torch._foreach_mul(xs, torch.tensor(2.5)), ints)  # a CPU scalar tensor


@pytest.mark.parametrize("weight", [0.3, "list", [0.1, 0.2, 0.3, 0.4, 0.5]])
def test_lerp(weight):
    xs, ys = _mixed(), _mixed()
    w = _mixed() if weight == "list" else weight
    compare(torch._foreach_lerp, xs, ys, w)


@pytest.mark.parametrize("value", [1, 0.5, [0.1, 0.2, 0.3, 0.4, 0.5]])
def test_addcmul_addcdiv(value):
    xs, ys, zs = _mixed(), _mixed(), _mixed()
    compare(lambda *a: (torch._foreach_addcmul(*a, value), torch._foreach_addcdiv(*a, value)),
            xs, ys, zs)


def test_pow_scalar_and_tensor():
    compare(lambda xs: torch._foreach_pow(2.0, xs), _mixed())


@pytest.mark.parametrize("ord", [2, 1, 3.0, 0.5])
def test_norm(ord):
    compare(lambda xs: torch._foreach_norm(xs, ord), _mixed())
    compare(lambda xs: torch._foreach_norm(xs, ord, dtype=torch.float64), _mixed()[:3])


@pytest.mark.parametrize("ord", [1, 2, 3.0])
def test_powsum(ord):
    xs = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64), torch.randn(2).bfloat16()]
    powsum = torch.ops.aten._foreach_powsum.Scalar
    compare(lambda xs: powsum(xs, ord), xs)
    compare(lambda xs: powsum(xs, ord, dtype=torch.float64), xs)


def test_inf_norm_and_max():
    xs = _mixed()[:3]
    compare(lambda xs: (torch._foreach_norm(xs, float("inf")), torch._foreach_max(xs)), xs)


def test_copy_and_zero():
    xs, ys = _mixed(), _mixed()

    def fn(xs, ys):
        a = [x.clone() for x in xs]
        torch._foreach_copy_(a, ys)
        b = [x.clone() for x in xs]
        torch._foreach_zero_(b)
        return a, b

    compare(fn, xs, ys)


def test_foreach_on_views_writes_through():
    base = torch.randn(4, 6)

    def fn(base):
        base = base.clone()
        views = [base[0], base[1:3, ::2], base[1:3, 1::2], base[3, :2]]
        torch._foreach_mul_(views, 3.0)
        torch._foreach_add_(views, [v.clone() for v in views], alpha=-0.5)
        return base

    compare(fn, base)


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("k", [1, 3])
def test_overlapping_tensors_of_a_list_apply_in_order(k):
    """Written tensors of one list that overlap (a row and a column of one matrix): the CPU
    applies the list one tensor after another, so x[k, k] gets both adds; pjrt runs such a
    call one element at a time (trace._overlapping_foreach), its other lists read after the
    writes before them. At once, x[k, k] got one add, silently."""
    def fn(x, y):
        x = x.clone()
        torch._foreach_add_([x[k], x[:, k], x[k, 1:4]], 3)
        torch._foreach_mul_([x[:, k], x[k]], [2.0, 3.0])
        torch._foreach_add_([x[k], x[:, 2]], [y[k], y[:, 2]], alpha=2)
        torch._foreach_addcmul_([x[k], x[k]], [y[k], y[k]], [x[k], x[k]], value=0.5)
        torch._foreach_add_([x[0], x[4]], 1)  # apart: all at once
        return x

    x, y = torch.arange(30.0).reshape(5, 6), torch.linspace(-1, 1, 30).reshape(5, 6)
    got = fn(x.to("pjrt"), y.to("pjrt")).cpu()
    assert torch.equal(got, fn(x, y)), (got - fn(x, y)).abs().max()
