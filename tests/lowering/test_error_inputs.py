"""Bad data raises on pjrt where it raises on the CPU, in every mode, never a silent result.

Focused cases first (token ids outside the vocabulary, class targets outside
[0, C), invalid multinomial distributions: each once returned a plausible result
on pjrt), forward and backward, in strict, fused, debug and torch.compile; then
PyTorch's own error inputs of op_db (torch_pjrt/conformance_errors.py).
"""

import os

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, to_cpu, to_device

import torch_pjrt
from torch_pjrt import conformance, conformance_errors
from torch_pjrt.conformance_known_failures import ERROR_INPUTS

MODES = ("strict", "fused", "debug", "compile")


@pytest.fixture(params=MODES)
def mode(request):
    if request.param == "compile":
        torch._dynamo.reset()
    with torch_pjrt.set_eager_mode("fused" if request.param == "compile" else request.param):
        yield request.param
    if request.param == "compile":
        torch._dynamo.reset()


def _runner(fn, mode):
    return torch.compile(fn, backend="pjrt", dynamic=False) if mode == "compile" else fn


def raises_as_on_cpu(fn, *args, mode: str, op: str) -> None:
    """fn(*args) raises on the CPU; on pjrt it raises the same type with the CPU's message
    and the op's name: at the op in debug mode, by the next synchronization otherwise.
    Afterwards the device works and has nothing left to report."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    run = _runner(fn, mode)
    dev = to_device(args)
    with pytest.raises(type(cpu.value)) as got:
        out = run(*dev)
        assert mode != "debug", "debug mode must raise at the op"
        to_cpu(out)
    if mode == "compile":  # from tracing or a compiled graph, not from an eager fallback
        assert torch_pjrt.counters.value("compile_eager_graphs") == 0
    message = str(got.value)
    expected = str(cpu.value).splitlines()[0].split("  (Could this error message")[0]
    assert expected in message, message
    assert op in message, message
    torch.pjrt.synchronize()  # the error was reported once, not again
    assert_same(torch.ones(3, device="pjrt") * 2, torch.full((3,), 2.0))


def same_as_cpu(fn, *args, mode: str) -> None:
    assert_same(_runner(fn, mode)(*to_device(args)), fn(*args))  # (the dtype's bound)
    if mode == "compile":
        assert torch_pjrt.counters.value("compile_eager_graphs") == 0


# ------------------------------------------------------------------ embedding
W = torch.randn(4, 3)


@pytest.mark.parametrize("ids", [[10], [-1], [[0, 3], [4, 1]]], ids=["past-end", "negative", "2d"])
def test_embedding_index_out_of_range(mode, ids):
    raises_as_on_cpu(F.embedding, torch.tensor(ids), W, mode=mode, op="aten.embedding")


def test_embedding_in_range_and_backward(mode):
    def step(w, i):
        w = w.detach().requires_grad_(True)
        out = F.embedding(i, w, padding_idx=0)
        (out * torch.arange(3.0, device=w.device)).sum().backward()
        return out, w.grad

    same_as_cpu(step, W, torch.tensor([[0, 3], [3, 1]]), mode=mode)


def test_embedding_dense_backward_ignores_rows_out_of_range(mode):
    # The CPU kernel skips indices outside [0, num_weights) (the forward raised for them).
    # (Not with scale_grad_by_freq: the CPU's kernel then writes out of bounds and aborts.)
    same_as_cpu(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 4, -1, False),
                torch.randn(4, 3), torch.tensor([1, 7, -1, 1]), mode=mode)


# ------------------------------------------------------------------ class targets
LOGP = torch.randn(2, 4).log_softmax(-1)


@pytest.mark.parametrize("target", [[9, 1], [-3, 1], [1, 4]])
def test_nll_loss_target_out_of_bounds(mode, target):
    raises_as_on_cpu(F.nll_loss, LOGP, torch.tensor(target), mode=mode, op="aten.nll_loss")


@pytest.mark.parametrize("kwargs", [{"reduction": "none"}, {"label_smoothing": 0.1}],
                         ids=["none", "smooth"])
def test_cross_entropy_target_out_of_bounds(mode, kwargs):
    raises_as_on_cpu(lambda x, t: F.cross_entropy(x, t, **kwargs), torch.randn(3, 4),
                     torch.tensor([0, 9, 2]), mode=mode, op="aten.nll_loss")


def test_cross_entropy_weighted_target_out_of_bounds(mode):
    raises_as_on_cpu(lambda x, t, w: F.cross_entropy(x, t, w), torch.randn(3, 4),
                     torch.tensor([0, 9, 2]), torch.rand(4), mode=mode, op="aten.nll_loss")


def test_nll_loss_2d_target_out_of_bounds(mode):
    raises_as_on_cpu(F.nll_loss, torch.randn(2, 4, 3, 3).log_softmax(1),
                     torch.full((2, 3, 3), 5), mode=mode, op="aten.nll_loss2d")


def test_nll_loss_backward_target_out_of_bounds(mode):
    def backward(x, t, grad, total):
        return torch.ops.aten.nll_loss_backward(grad, x, t, None, 1, -100, total)

    raises_as_on_cpu(backward, LOGP, torch.tensor([9, 1]), torch.tensor(1.0), torch.tensor(2.0),
                     mode=mode, op="aten.nll_loss_backward")


def test_ignore_index_keeps_working(mode):
    def loss_and_grad(x, t, ignore):
        x = x.detach().requires_grad_(True)
        loss = F.cross_entropy(x, t, ignore_index=ignore)
        loss.backward()
        return loss, x.grad

    x = torch.randn(3, 4)
    same_as_cpu(lambda x, t: loss_and_grad(x, t, -100), x, torch.tensor([-100, 1, 3]), mode=mode)
    # an ignore_index outside [0, C) is not a bad target
    same_as_cpu(lambda x, t: loss_and_grad(x, t, 9), x, torch.tensor([9, 1, 3]), mode=mode)
    same_as_cpu(lambda x, t: loss_and_grad(x, t, 2), x, torch.tensor([2, 1, 3]), mode=mode)


# ------------------------------------------------------------------ multinomial
BAD_PROBABILITIES = {"negative": [0.5, -0.1, 0.6], "nan": [0.5, float("nan"), 0.6],
                     "inf": [0.5, float("inf"), 0.6], "zeros": [0.0, 0.0, 0.0],
                     "zero-row": [[0.5, 0.2, 0.3], [0.0, 0.0, 0.0]]}


@pytest.mark.parametrize("draws", [(1, False), (2, False), (3, True)],
                         ids=["one", "no-replacement", "replacement"])
@pytest.mark.parametrize("p", BAD_PROBABILITIES.values(), ids=BAD_PROBABILITIES.keys())
def test_multinomial_invalid_distribution(mode, p, draws):
    n, replacement = draws
    raises_as_on_cpu(lambda p: torch.multinomial(p, n, replacement), torch.tensor(p),
                     mode=mode, op="aten.multinomial")


def test_multinomial_few_nonzero_without_replacement(mode):
    # The CPU draws the zero-probability categories last rather than raising.
    out = _runner(lambda p: torch.multinomial(p, 2), mode)(torch.tensor([0.0, 0.5, 0.0],
                                                                        device="pjrt"))
    first, second = out.cpu().tolist()
    assert first == 1 and second in (0, 2)


# ------------------------------------------------------------------ more bad data
# Data-dependent errors op_db has no error input for (each was silent or another exception
# type on pjrt before its check).
def _unpool(x, i):
    return F.max_unpool1d(x, i, 2)


BAD_DATA = {
    "bernoulli": (torch.bernoulli, (torch.tensor([0.5, 1.5]),), "aten.bernoulli"),
    # (+ 1: Dynamo compiles no graph of a lone in-place op on an input)
    "bernoulli_": (lambda x, p: x.bernoulli_(p) + 1, (torch.zeros(2), torch.tensor([0.5, -0.5])),
                   "aten.bernoulli"),
    "normal-std": (torch.normal, (torch.zeros(2), torch.tensor([1.0, -1.0])), "aten.normal"),
    # (bounds the wrong way round: eager raises the CPU's error at the call, its message
    # naming `random_`; a compiled graph's device check names aten.random)
    "random_": (lambda x: x.random_(5, 2) + 1, (torch.zeros(2),), "random"),
    "uniform_": (lambda x: x.uniform_(3, -1) + 1, (torch.zeros(2),), "uniform"),
    "max_unpool": (_unpool, (torch.ones(1, 1, 2), torch.tensor([[[0, 9]]])), "aten.max_unpool2d"),
}


@pytest.mark.parametrize("case", BAD_DATA.values(), ids=BAD_DATA.keys())
def test_more_bad_data(mode, case):
    fn, args, op = case
    raises_as_on_cpu(fn, *args, mode=mode, op=op)


# ------------------------------------------------------------------ op_db's error inputs
# CI runs a fixed slice of the ops that list error inputs, in every mode: the ops whose
# errors come from device-side checks, from the lowerings' own checks, from the executor's
# overlap check, and a few whose errors come from meta kernels. All of op_db's 226 ops in
# every mode took 29 min on the loaded 2-core machine; this slice about 90 s (December 3).
# TORCH_PJRT_SLOW_TESTS=1 runs every op in every mode, as `python -m torch_pjrt ops
# --errors --report` does for docs/error-inputs.md.
CI_SLICE = (  # each a different kind of check: bounds, probabilities, sizes, dtypes
    "nn.functional.embedding", "gather", "index_select", "multinomial", "masked_scatter",
    "cat", "kthvalue", "nn.functional.conv1d", "bernoulli",
)


def _sweep_params():
    ops = conformance_errors.ops_with_error_inputs()
    slow = os.environ.get("TORCH_PJRT_SLOW_TESTS", "").strip() not in ("", "0")
    return [pytest.param(op, mode, id=f"{conformance_errors.op_name(op)}-{mode}")
            for op in ops if slow or conformance_errors.op_name(op) in CI_SLICE
            for mode in conformance_errors.MODES]


def test_ci_slice_names_ops_with_error_inputs():
    names = {conformance_errors.op_name(o) for o in conformance_errors.ops_with_error_inputs()}
    assert set(CI_SLICE) <= names
    unknown = {k.split("@")[0] for k in ERROR_INPUTS} - names
    assert not unknown, f"known error-input failures of ops without error inputs: {unknown}"


@pytest.mark.parametrize(("opinfo", "sweep_mode"), _sweep_params())
def test_op_db_error_inputs(opinfo, sweep_mode):
    r = conformance_errors.run_op_errors(opinfo, (sweep_mode,), time_limit=600)
    conformance.release_compiled()
    verdict = conformance_errors.verdict(r, sweep_mode)
    failures = "; ".join([r.error] if r.error else r.failures.get(sweep_mode, []))
    if verdict == "unexpected":
        pytest.fail(f"{r.name} in {sweep_mode}: {failures}", pytrace=False)
    if verdict == "expected":
        pytest.xfail(f"known: {failures}")
    if verdict == "fixed":
        pytest.fail(f"{r.name} rejects every error input in {sweep_mode} now: delete it from "
                    "ERROR_INPUTS in torch_pjrt/conformance_known_failures.py", pytrace=False)
    assert r.rejected(sweep_mode) > 0 or r.cpu_accepts == r.inputs
