"""PyTorch's OpInfo samples through torch.compile(backend="pjrt") against CPU eager:
values, dtypes and shapes forward, and input gradients backward (float32).

The op runs as `torch.compile(fn, backend="pjrt", fullgraph=False, dynamic=False)` on
the sample moved to pjrt, through torch_pjrt.conformance's runner (the eager sweep's),
so a compiled graph is held to what eager pjrt is held to. A fixed slice of ops with a
few samples each runs in CI; TORCH_PJRT_SLOW_TESTS=1 adds every op of op_db. Expected
failures: tests/compile/compile_known_failures.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from compile_known_failures import BACKWARD, FORWARD, KNOWN_FAILURES
from torch.utils._pytree import tree_flatten

from torch_pjrt import conformance, counters

# Families a model compiles: elementwise, reductions, matmul, views, indexing,
# normalization, attention, losses, factories.
CI_SLICE = (
    "add", "mul", "div.no_rounding_mode", "where", "clamp", "exp", "nn.functional.gelu",
    "sum", "amax", "softmax", "cumsum", "matmul", "addmm", "reshape", "transpose", "cat",
    "__getitem__", "index_put", "gather", "nn.functional.layer_norm", "nn.functional.embedding",
    "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy",
)
CI_MAX_SAMPLES = 2
SLOW_MAX_SAMPLES = 8


# OpInfo calls that Dynamo cannot trace (wrapper_set_seed's freeze_rng_state breaks the
# graph, and the whole op then runs in eager): the function itself is compiled instead.
UNWRAPPED = {"nn.functional.scaled_dot_product_attention":
             torch.nn.functional.scaled_dot_product_attention}


class Compiled:
    """An OpInfo whose call on pjrt tensors is compiled (on CPU tensors: the op itself, the
    reference). Each call compiles afresh, so no sample is left to eager by Dynamo's
    recompile limit. `graphs`: how many graphs reached the pjrt backend."""

    def __init__(self, info):
        self._info = info
        self.graphs = 0

    def __getattr__(self, name):
        return getattr(self._info, name)

    def __call__(self, *args, **kwargs):
        on_pjrt = torch.get_default_device().type == "pjrt" or any(
            isinstance(t, torch.Tensor) and t.device.type == "pjrt"
            for t in tree_flatten([args, kwargs])[0])
        if not on_pjrt:
            return self._info(*args, **kwargs)
        op = UNWRAPPED.get(conformance.op_name(self._info), self._info.op)

        def fn(*a, **k):
            return op(*a, **k)

        torch._dynamo.reset()
        before = _graphs()
        try:
            return torch.compile(fn, backend="pjrt", fullgraph=False, dynamic=False)(
                *args, **kwargs)
        finally:
            self.graphs += _graphs() - before


def _graphs() -> int:
    return counters.value("compiled_graphs") + counters.value("compile_eager_graphs")


def run(name: str, direction: str, max_samples: int | None) -> conformance.Outcome:
    """The op's outcome; a pass where no graph reached our backend is a skip (the op ran
    in eager: nothing compiled was compared)."""
    (info,) = conformance.select_ops([name])
    compiled = Compiled(info)
    outcome = conformance.run_direction(compiled, direction, max_samples=max_samples)
    if outcome.status in ("pass", "fallback") and not compiled.graphs:
        outcome = dataclasses.replace(outcome, status="skip",
                                      reason="no graph reached the pjrt backend")
    return outcome


def judge(name: str, direction: str, outcome: conformance.Outcome) -> None:
    """Fail an unlisted failure, or a compile-listed op that now passes every sample."""
    verdict = conformance.verdict(name, direction, outcome, KNOWN_FAILURES)
    own = (FORWARD if direction == "forward" else BACKWARD).get(name)
    if verdict == "unexpected":
        pytest.fail(f"{name} {direction} compiled: {outcome.reason}", pytrace=False)
    if verdict == "expected":
        pytest.xfail(f"known: {KNOWN_FAILURES[direction][name]} (now: {outcome.reason})")
    if verdict == "fixed" and own is not None:
        pytest.fail(f"{name} {direction} compiled passes now but is listed ({own}): delete it "
                    "from tests/compile/compile_known_failures.py", pytrace=False)
    if outcome.status == "skip":
        pytest.skip(outcome.reason)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled():
    yield
    conformance.release_compiled()


def test_known_failures_name_op_db_ops():
    names = {conformance.op_name(o) for o in conformance.all_ops()}
    for listed in (FORWARD, BACKWARD):
        assert not sorted(set(listed) - names)


@pytest.mark.parametrize("direction", conformance.DIRECTIONS)
@pytest.mark.parametrize("name", CI_SLICE)
def test_compiled_opinfo_slice(name, direction):
    outcome = run(name, direction, CI_MAX_SAMPLES)
    assert outcome.reason != "no graph reached the pjrt backend"
    judge(name, direction, outcome)


@pytest.mark.slow
@pytest.mark.parametrize("direction", conformance.DIRECTIONS)
@pytest.mark.parametrize("name", sorted({conformance.op_name(o) for o in conformance.all_ops()}
                                        - set(CI_SLICE)))
def test_compiled_opinfo_all(name, direction):
    outcome = run(name, direction, SLOW_MAX_SAMPLES)
    if direction == "backward":
        conformance.release_compiled()
    judge(name, direction, outcome)
