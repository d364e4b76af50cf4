"""Where PyTorch's CPU and CUDA kernels refuse a dtype, pjrt raises the same error; where
only the CPU refuses and CUDA computes, pjrt computes (eager/refusals.py). The sweep
(tools/dtype_refusal_sweep.py) runs every OpInfo in every dtype neither takes; here its
findings of December 5, each once silently computed, run again, small and large."""

import importlib.util
import pathlib

import pytest
import torch

from torch_pjrt import conformance

pytestmark = pytest.mark.usefixtures("eager_mode")

_SWEEP = pathlib.Path(__file__).parents[2] / "tools" / "dtype_refusal_sweep.py"


def _sweep():
    spec = importlib.util.spec_from_file_location("dtype_refusal_sweep", _SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outcome(fn, device):
    try:
        out = fn(device)
        for t in out if isinstance(out, tuple) else (out,):
            t.cpu()
        return "computed"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).replace('_cuda', '_cpu')}"


def _t(shape, dtype, device):
    return torch.ones(shape, dtype=dtype, device=device)


# (description, call): each computed on pjrt before, and CPU and CUDA raise. Shapes of
# 3 elements run cpu_check's stand-ins; of 100,000, the one-element refusal check.
REFUSED = {
    "hypot of int64": lambda d, n: torch.hypot(_t(n, torch.int64, d), _t(n, torch.int64, d)),
    "lerp_ of int64": lambda d, n: _t(n, torch.int64, d).lerp_(_t(n, torch.int64, d), 0.5),
    "lt of complex64": lambda d, n: _t(n, torch.complex64, d) < _t(n, torch.complex64, d),
    "gelu of int32": lambda d, n: torch.nn.functional.gelu(_t(n, torch.int32, d)),
    "softmax of int64": lambda d, n: torch.softmax(_t(n, torch.int64, d), 0),
    "relu of complex64": lambda d, n: torch.relu(_t(n, torch.complex64, d)),
    "clamp_min_ of complex64": lambda d, n: _t(n, torch.complex64, d).clamp_min_(0),
    "sign of complex64": lambda d, n: _t(n, torch.complex64, d).sign(),
    "atan2 of complex64": lambda d, n: torch.atan2(_t(n, torch.complex64, d),
                                                   _t(n, torch.complex64, d)),
    "matmul of bool": lambda d, n: _t((n, 2), torch.bool, d).t() @ _t((n, 2), torch.bool, d),
    "normal_ of int64": lambda d, n: torch.empty(n, dtype=torch.int64, device=d).normal_(),
    "round of complex64": lambda d, n: torch.round(_t(n, torch.complex64, d)),
    "gcd of float32": lambda d, n: torch.gcd(_t(n, torch.float32, d), _t(n, torch.float32, d)),
}


@pytest.mark.parametrize("n", [3, 100_000])
@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cpu_and_cuda_refuse_pjrt_refuses(name, n):
    cpu = _outcome(lambda d: REFUSED[name](d, n), "cpu")
    assert cpu.startswith("NotImplementedError"), cpu
    assert _outcome(lambda d: REFUSED[name](d, n), "pjrt") == cpu


# What only the CPU refuses: CUDA computes these, and so does pjrt.
def test_what_cuda_takes_pjrt_computes():
    x = torch.tensor([True, False, True])
    assert torch.equal(x.to("pjrt").abs().cpu(), x)
    counts = torch.histc(torch.arange(10, device="pjrt"), bins=5, min=0, max=10)
    assert torch.equal(counts.cpu(), torch.histc(torch.arange(10.0), bins=5, min=0, max=10)
                       .to(counts.dtype))
    with pytest.raises(NotImplementedError):
        torch.histc(torch.arange(10), bins=5, min=0, max=10)  # the CPU's own refusal


def test_the_refusal_is_the_cpus_error_with_its_message():
    with pytest.raises(NotImplementedError, match="\"hypot_cpu\" not implemented for 'Long'"):
        torch.hypot(_t(3, torch.int64, "pjrt"), _t(3, torch.int64, "pjrt")).cpu()


def test_cuda_takes_is_what_pytorchs_opinfos_say(eager_mode):
    if eager_mode != "strict":
        pytest.skip("runs on the CPU only")
    from torch_pjrt.eager.refusals import CUDA_TAKES

    sweep = _sweep()
    found = sweep.cpu_refusals(conformance.all_ops())
    assert {k: frozenset(v) for k, v in found.items()} == CUDA_TAKES


def test_the_sweep_finds_nothing_left_on_the_ops_it_found_before(eager_mode):
    if eager_mode == "debug":
        pytest.skip("strict and fused are enough for a sweep")
    sweep = _sweep()
    ops = conformance.select_ops(FOUND_BEFORE)
    left = [(name, str(dtype), error) for name, dtype, _, error in sweep.sweep(ops, samples=1)
            if (name, str(dtype)[6:]) not in KNOWN]
    assert not left, left


# A sample of the ops the first sweep found (December 5: 792 (op, dtype) pairs over 214
# OpInfos), one of each kind of kernel.
FOUND_BEFORE = ["hypot", "lerp", "lt", "nn.functional.gelu", "softmax", "nn.functional.relu",
                "clamp", "sign", "atan2", "matmul", "round", "gcd", "bitwise_left_shift",
                "nn.functional.conv2d", "nn.functional.interpolate.bilinear",
                "nn.functional.adaptive_avg_pool2d", "nn.functional.nll_loss", "igamma",
                "special.bessel_j0", "cummax", "amax", "nn.functional.batch_norm",
                "nn.functional.group_norm", "arange", "frac", "logaddexp"]
# (op, dtype) the sweep still lists, and why.
KNOWN: set[tuple[str, str]] = set()
