"""The native cache key (shim lookup): every call it keys must find the entry the Python
key would, so repeated calls (the second one a native hit) match the CPU."""

import pytest
import torch

import torch_pjrt
from torch_pjrt.eager import op_cache


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    with torch_pjrt.set_eager_mode(request.param):
        yield request.param


def _native_keys() -> int:
    return sum(1 for k in op_cache.cache if type(k[0]) is int)


CASES = {
    "add": lambda a, b: a + b,
    "same storage twice": lambda a, b: a + a,
    "views at offsets": lambda a, b: a[1:5] + a[3:7],
    "strided view": lambda a, b: a[::2] * b[1::2],
    "python number": lambda a, b: a * 2.5,
    "int number": lambda a, b: a + 3,
    "bool number": lambda a, b: a * True,
    "cpu scalar tensor": lambda a, b: a + torch.tensor(2.0),
    "negative view": lambda a, b: torch._neg_view(a) + b,
    "dim list": lambda a, b: a.reshape(2, 4).sum([1]),
    "keepdim": lambda a, b: a.reshape(2, 4).sum(1, True),
    "tensor list": lambda a, b: torch.cat([a, b, a]),
    "index": lambda a, b: a[torch.tensor([1, 3, 5], device=a.device)],
    "in place": lambda a, b: a.clone().add_(b),
    "out=": lambda a, b: torch.add(a, b, out=torch.empty(8, device=a.device)),
    "uninitialized storage": lambda a, b: torch.empty(8, device=a.device).zero_() + b,
    "dtype view": lambda a, b: a.view(torch.int32) + 1,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "pow scalar": lambda a, b: a.abs() ** 0.5,
    # the indexing ops' native kernel hands calls with boolean masks to their Python kernel
    "boolean mask": lambda a, b: a[a > 0],
    "uint8 mask": lambda a, b: a[(a > 0).to(torch.uint8)],
    "index_put": lambda a, b: a.index_put((torch.tensor([0, 2], device=a.device),), b[:2]),
    "index_put_ with a mask": lambda a, b: a.clone().index_put_((a > 0,), b[0]),
    "masked assignment": lambda a, b: _assign(a.clone(), a < 0, b[3]),
    "index_put_ accumulate": lambda a, b: a.clone().index_put_(
        (torch.tensor([1, 1, 4], device=a.device),), b[:3], accumulate=True),
    # and calls with indices on the CPU, which PyTorch takes for a tensor on any device
    "CPU indices": lambda a, b: a[torch.tensor([1, 3, -1])],
    "CPU mask": lambda a, b: a[(a > 0).cpu()],
    "index_put_ at CPU indices": lambda a, b: a.clone().index_put_(
        (torch.tensor([0, 2]),), b[:2], accumulate=True),
    "assignment at CPU indices": lambda a, b: _assign(a.clone(), torch.tensor([1, -1]), b[0]),
}


def _assign(x, mask, value):
    x[mask] = value
    return x


@pytest.mark.parametrize("case", CASES)
def test_repeated_calls_match_cpu(mode, case):
    fn = CASES[case]
    a, b = torch.randn(8), torch.randn(8)
    want = fn(a, b)
    for _ in range(3):  # compile, then a Python-key hit that files the native key, then native
        da, db = a.to("pjrt"), b.to("pjrt")
        got = fn(da, db)
        assert got.device.type == "pjrt"
        torch.testing.assert_close(got.cpu(), want)


def test_native_keys_are_filed_and_hit(mode):
    a, b = torch.randn(8, device="pjrt"), torch.randn(8, device="pjrt")
    a + b
    a + b
    before = _native_keys()
    torch_pjrt.counters.reset()
    for _ in range(5):
        a + b
    assert _native_keys() == before and before > 0
    assert torch_pjrt.metrics()["cache_hits"] == 5
    assert op_cache.cache_size() < len(op_cache.cache)


def test_a_new_signature_is_a_new_entry(mode):
    x = torch.randn(16)
    d = x.to("pjrt")
    for shape in [(16,), (4, 4), (2, 8)]:
        for _ in range(2):
            torch.testing.assert_close((d.view(shape) * 2).cpu(), x.view(shape) * 2)
    # a written storage whose dtype changes: the key reads the storage's dtype
    s = torch.zeros(4, device="pjrt")
    s.view(torch.int32).fill_(1)
    for _ in range(2):
        torch.testing.assert_close((s + 0).cpu(), torch.zeros(4).view(torch.int32).fill_(1)
                                   .view(torch.float32))


def test_errors_still_raise_at_the_op(mode):
    a, b = torch.randn(8, device="pjrt"), torch.randn(3, device="pjrt")
    a + a
    a + a
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(8)
    c = torch.randn(8, device="pjrt:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + c
    torch.testing.assert_close((c + c).cpu(), c.cpu() * 2)


def test_python_ints_past_int64_meet_uint64_tensors(mode):
    """A Python int in uint64's upper half (2**64 - 1) is a run-time value JAX parses as
    int64: it overflowed (OverflowError where the CPU computes). Three calls each, so the
    second and third take the cached (native) path."""
    cpu = torch.full((4,), 2 ** 64 - 1, dtype=torch.uint64)
    cpu[1] = 5
    for _ in range(3):
        t = cpu.to("pjrt")
        assert torch.equal((t == 5).cpu(), cpu == 5)  # a small int first: the same op
        assert torch.equal((t == 2 ** 64 - 1).cpu(), cpu == 2 ** 64 - 1)
        assert torch.equal(t.ne(2 ** 63).cpu(), cpu.ne(2 ** 63))
        assert torch.equal((t.float() < 2 ** 64 - 1).cpu(), cpu.float() < 2 ** 64 - 1)


# numbers of every range: each bound, either side of it, NaN and the infinities
_NUMBERS = [5, 100, 127, 128, 255, 256, -1, -128, -129, 32767, 32768, 65504, 65505, 70000,
            2 ** 31, 2 ** 53 + 1, 2.5, -0.5, 127.5, 300.0, 65504.0, 65520.0, 1e10, -1e10,
            3.4e38, 3.5e38, float("inf"), float("-inf"), float("nan")]
_CONVERTING = {
    "fill_": lambda x, v: x.fill_(v),
    "add_ alpha": lambda x, v: x.add_(torch.ones_like(x), alpha=v),
    "masked_fill": lambda x, v: x.masked_fill(torch.tensor([True, False], device=x.device), v),
    "full_like": lambda x, v: torch.full_like(x, v),
}


def _outcome(fn, x, v):
    try:
        return fn(x, v).cpu()
    except (RuntimeError, OverflowError) as e:
        return type(e).__name__ + ": " + str(e).split("\n")[0]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32,
                                   torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", _CONVERTING)
def test_numbers_an_op_converts_are_checked_at_every_call(mode, op, dtype):
    """A signature's entry was checked at its first call only: int8's fill_(1000) after
    fill_(5) returned -24 where the CPU raises "value cannot be converted to type int8_t
    without overflow". The key holds each run-time number's range (eager/scalars.py), so a
    number of another range is checked again; every number twice (a native hit), in an
    order that puts out-of-range numbers after in-range ones of the same type."""
    fn = _CONVERTING[op]
    for v in _NUMBERS + _NUMBERS:
        want = _outcome(fn, torch.zeros(2, dtype=dtype), v)
        got = _outcome(fn, torch.zeros(2, dtype=dtype, device="pjrt"), v)
        if isinstance(want, str) or isinstance(got, str):
            assert got == want, (v, got, want)
        else:
            torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m, v=v: f"{v}: {m}")
