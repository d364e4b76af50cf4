"""Bad input raises PyTorch's own errors, before any device work."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")


def test_shape_mismatch():
    a, b = torch.ones(2, 3, device="pjrt"), torch.ones(4, device="pjrt")
    with pytest.raises(RuntimeError, match="must match the size|broadcast a dimension of length 4"):
        a + b
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim|size mismatch"):
        a @ a


def test_bad_dim():
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.ones(2, 3, device="pjrt").sum(5)


def test_dtype_error():
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.long, device="pjrt").add_(torch.ones(2, device="pjrt") * 0.5)


def test_device_mismatch_and_cpu_scalars():
    d = torch.ones(3, device="pjrt")
    with pytest.raises(RuntimeError, match="same device"):
        d + torch.ones(3)
    # 0-dim CPU tensors are allowed, as on CUDA
    assert torch.equal((d * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    # also where PyTorch's meta function checks the device without that rule
    mask = torch.tensor([True, False, True])
    want = torch.ones(3).masked_fill(mask, torch.tensor(float("-inf")))
    assert torch.equal(d.masked_fill(mask.to("pjrt"), torch.tensor(float("-inf"))).cpu(), want)
    assert torch.equal(d.clone().masked_fill_(mask.to("pjrt"), torch.tensor(float("-inf")))
                       .cpu(), want)


def test_block_diag_names_the_inputs_on_other_devices():
    """block_diag checks its inputs' devices itself, with its own message (PyTorch's
    test_block_diag matches it)."""
    with pytest.raises(RuntimeError, match="torch.block_diag: input tensors must all be on "
                       "the same device. Input 0 is on device cpu and input 1 is on device pjrt"):
        torch.block_diag(torch.ones(2, 2), torch.ones(2, 2, device="pjrt"))
    with pytest.raises(RuntimeError, match="Input 0 is on device pjrt:0 and input 2 is on "
                       "device cpu"):
        torch.block_diag(*(torch.ones(1, device=d) for d in ("pjrt", "pjrt", "cpu")))


def test_index_out_of_range_is_an_error_not_a_clamp():
    d = torch.arange(4.0, device="pjrt")
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        d[torch.tensor([4], device="pjrt")].cpu()
    with pytest.raises(IndexError, match="index -5 is out of bounds"):
        d[torch.tensor([-5], device="pjrt")].tolist()
    assert d[torch.tensor([-1], device="pjrt")].item() == 3.0


# Calls whose meta function passes and whose CPU kernel raises: the checks only the kernel
# makes (eager/meta.py cpu_check). Each runs on the CPU and on pjrt: the same exception type.
def _overlap_cat(x):
    return torch.cat([x, x], out=x)


KERNEL_CHECKS = {
    "in-place result dtype": lambda x: x.long().mul_(2.5),
    "in-place bool result": lambda x: (x > 0).mul_(-1.5),
    "out= partly overlapping an input": lambda x: torch.add(x[:5], 1, out=x[1:]),
    "copy_ onto an overlapping self": lambda x: x.view(2, 3).expand(2, 2, 3).copy_(
        torch.ones(2, 2, 3)),
    "cat into one of its inputs": _overlap_cat,
    "index_put_ values that do not broadcast": lambda x: x.index_put_(
        (torch.tensor([0, 1], device=x.device),), torch.ones(3, device=x.device)),
    "index_select of a 0-dim tensor with several indices": lambda x: x[0].index_select(
        0, torch.tensor([0, 0], device=x.device)),
    "copy_ from an empty source": lambda x: x.copy_(torch.ones(0, device=x.device)),
    "fill_ with a complex number": lambda x: x.long().fill_(1j),
}


@pytest.mark.parametrize("case", list(KERNEL_CHECKS))
def test_kernel_checks_raise_as_on_cpu(case):
    fn = KERNEL_CHECKS[case]
    with pytest.raises(Exception) as cpu:
        fn(torch.arange(6.0))
    with pytest.raises(type(cpu.value)) as dev:
        fn(torch.arange(6.0, device="pjrt"))
        torch.pjrt.synchronize()
    assert str(cpu.value).split("\n")[0] in str(dev.value), (cpu.value, dev.value)


@pytest.mark.parametrize("call", ["item", "_local_scalar_dense"])
def test_scalar_of_an_empty_tensor(call):
    # PyTorch's test__local_scalar_dense_with_empty_tensor: each says it as the CPU does
    fn = (lambda t: t.item()) if call == "item" else torch.ops.aten._local_scalar_dense
    with pytest.raises(RuntimeError) as cpu:
        fn(torch.randn(0))
    with pytest.raises(RuntimeError) as dev:
        fn(torch.randn(0, device="pjrt"))
    assert str(dev.value) == str(cpu.value)


def test_cat_into_its_input_too_large_for_the_stand_ins():
    x = torch.zeros(1 << 20, device="pjrt")
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.cat([x, x], out=x)
    assert x.shape == (1 << 20,)


@pytest.mark.parametrize("op", ["add", "cat"])
def test_resized_out_gets_the_inputs_layout(op):
    def run(device):
        x = torch.arange(12.0, device=device).view(4, 3).t()
        out = torch.empty(5, device=device)
        if op == "add":
            torch.add(x, 1, out=out)
        else:
            torch.cat([x, x], out=out)
        return out
    cpu, dev = run("cpu"), run("pjrt")
    assert (dev.shape, dev.stride()) == (cpu.shape, cpu.stride())
    torch.testing.assert_close(dev.cpu(), cpu)


# Calls whose stand-ins of zeros fail on the CPU, for their data: pjrt runs them as the CPU
# does (cpu_check counts an error only if it does not depend on the data).
DATA_DEPENDENT = {
    "integer division": lambda x: torch.div(x.long() + 1, x.long() + 1, rounding_mode="trunc"),
    "multinomial": lambda x: torch.multinomial(x + 1, 2, generator=None).shape,
    "linalg.solve": lambda x: torch.linalg.solve(
        x.view(2, 3)[:, :2] + torch.eye(2, device=x.device), x.view(2, 3)),
    "linalg.cholesky": lambda x: torch.linalg.cholesky(torch.eye(3, device=x.device) * (x[0] + 1)),
}


@pytest.mark.parametrize("case", list(DATA_DEPENDENT))
def test_errors_of_zero_data_are_not_raised(case):
    cpu = DATA_DEPENDENT[case](torch.arange(6.0))
    dev = DATA_DEPENDENT[case](torch.arange(6.0, device="pjrt"))
    if isinstance(cpu, torch.Tensor):
        torch.testing.assert_close(dev.cpu(), cpu)
    else:
        assert dev == cpu


def test_mask_assignment_of_a_cpu_number_of_another_dtype():
    # (PyTorch runs it as masked_fill_: index_put_ itself would refuse the dtypes)
    def run(device):
        x = torch.arange(6.0, device=device).view(2, 3)
        x[x[:, 0] > 1] = torch.tensor(7)
        y = torch.arange(3, device=device)
        y[y > 1] = torch.tensor([2.5], device=device)  # (a device value: another dtype)
        y[y > 0] = y[2]  # (a value overlapping x)
        return x, torch.index_put(x, (x > 2,), torch.tensor(-1)), y
    for cpu, dev in zip(run("cpu"), run("pjrt")):
        torch.testing.assert_close(dev.cpu(), cpu)


def test_number_that_does_not_fit_the_dtype():
    x = torch.zeros((), dtype=torch.int64, device="pjrt")
    with pytest.raises(RuntimeError, match="value cannot be converted to type int64_t"):
        x[...] = 1 + 2j
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t"):
        torch.full((2,), 300, dtype=torch.uint8, device="pjrt")


@pytest.mark.parametrize("norm", ["layer", "batch", "group"])
def test_bfloat16_norm_backward_that_only_the_cpu_kernel_refuses(norm):
    """A small bfloat16 norm's backward gets float32 statistics from its forward (as on
    CUDA); the CPU kernel, whose forward returns bfloat16 ones, refuses that pair. The
    kernel check must not raise it: small bfloat16 models (FSDP's mixed precision) trained."""
    make = {"layer": lambda: torch.nn.LayerNorm(16), "batch": lambda: torch.nn.BatchNorm1d(16),
            "group": lambda: torch.nn.GroupNorm(4, 16)}[norm]
    torch.manual_seed(0)
    cpu = make().to(torch.bfloat16)
    dev = make().to(torch.bfloat16).to("pjrt")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    xc, xd = x.clone().requires_grad_(), x.to("pjrt").requires_grad_()
    cpu(xc).square().sum().backward()
    dev(xd).square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, atol=0.1, rtol=0.05)
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("mask", [[True], [False] * 6, "uint8 4x4"])
@pytest.mark.parametrize("where", ["pjrt", "cpu"])
def test_mask_of_another_shape_than_the_indexed_dimensions(mask, where):
    # (PyTorch's test_indexing: it returned x[nonzero(mask)], shaped by the mask)
    mask = torch.zeros(4, 4, dtype=torch.uint8) if mask == "uint8 4x4" else torch.tensor(mask)
    x = torch.ones(5, 4, 3, device="pjrt")
    for index in (mask.to(where), (slice(None), mask.to(where))):
        with pytest.raises(IndexError, match="The shape of the mask"):
            x[index]
        with pytest.raises(IndexError, match="The shape of the mask"):
            x[index] = 2.0


_SHIFTS = {
    "<<= float": (lambda x: x[:-1].__ilshift__(x[1:]), torch.float32),
    ">>= float": (lambda x: x[:-1].__irshift__(x[1:]), torch.float32),
    "<<= int": (lambda x: x[:-1].__ilshift__(x[1:]), torch.int64),
    "&= int": (lambda x: x[:-1].__iand__(x[1:]), torch.int64),
    "|= itself": (lambda x: x.__ior__(x), torch.int64),
    "^= disjoint": (lambda x: x[:3].__ixor__(x[3:]), torch.int64),
    "<<= strided": (lambda x: x[::2].__ilshift__(x[1::2]), torch.int64),
}


@pytest.mark.parametrize("case", list(_SHIFTS))
def test_in_place_bitwise_ops_refuse_overlap_as_the_cpu(case):
    # PyTorch's test_shift_mem_overlap: the in-place decomposition (the op, then copy_)
    # computed x[:-1] <<= x[1:] of integers, and refused floats by dtype first
    fn, dtype = _SHIFTS[case]
    try:
        expected = fn(torch.arange(6, dtype=dtype))
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as dev:
            fn(torch.arange(6, dtype=dtype, device="pjrt"))
        assert str(dev.value) == str(e)
        return
    assert torch.equal(fn(torch.arange(6, dtype=dtype, device="pjrt")).cpu(), expected)


@pytest.mark.parametrize("inplace", [False, True])
def test_index_fill_takes_an_index_on_the_cpu_as_the_cpu_does(inplace):
    """index_fill(_) takes a 1-d index tensor on the CPU, as the CPU kernel does (PyTorch's
    test_stable_sort_against_numpy fills device tensors at `torch.randint` indices); the
    other indexing ops refuse one, as CUDA does."""
    x = torch.randn(4, 5)
    index = torch.tensor([3, 0, 3])
    value = torch.tensor(-2.0)
    for dim, fill in ((0, float("inf")), (1, value), (-1, 7)):
        idx = index if dim == 0 else index.clamp(max=4)
        want = x.clone().index_fill_(dim, idx, fill) if inplace else x.index_fill(dim, idx, fill)
        d = x.to("pjrt")
        got = d.index_fill_(dim, idx, fill) if inplace else d.index_fill(dim, idx, fill)
        assert idx.device.type == "cpu"
        torch.testing.assert_close(got.cpu(), want)
    # gradients flow through, the backward's index_fill taking the CPU index too
    w = torch.randn(4, 5, device="pjrt", requires_grad=True)
    w.index_fill(0, index, 0.0).sum().backward()
    want = torch.ones(4, 5).index_fill_(0, index, 0.0)
    assert torch.equal(w.grad.cpu(), want)
    # an index out of range is still an error
    with pytest.raises(IndexError, match="out of range|out of bounds"):
        x.to("pjrt").index_fill(0, torch.tensor([4]), 1.0).cpu()
    with pytest.raises(RuntimeError, match="same device"):
        x.to("pjrt").index_select(0, index)
