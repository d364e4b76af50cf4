"""Bad indices (negative, past the end, very negative, another dtype) given to every aten
call op_db's samples make with an index argument (tools/index_sweep.py generates them):
where the CPU raises, pjrt raises; where the CPU wraps a negative index or takes the other
dtype, pjrt gives its values; where the CPU's kernel reads the index unchecked, pjrt raises.
CI runs the first case of each overload and kind of bad index in every eager mode, and
under torch.compile the first case of each overload and index argument; `python
tools/index_sweep.py` runs them all. The OpInfos that make such calls are read from
tools/index_sweep_sources.json (`python tools/index_sweep.py --write-sources` writes it)
where it was written for this torch; else all of op_db is walked (a minute more)."""

import functools
import importlib.util
import pathlib
import sys

import pytest

_SWEEP = pathlib.Path(__file__).parents[2] / "tools" / "index_sweep.py"


@functools.cache
def _sweep():
    spec = importlib.util.spec_from_file_location("index_sweep", _SWEEP)
    module = importlib.util.module_from_spec(spec)
    sys.modules["index_sweep"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def _cases():
    sweep = _sweep()
    return list(sweep.cases(sweep.calls(sources=sweep.cached_sources())))


def _firsts(key):
    """The first case of each value of key(call, what)."""
    seen, out = set(), []
    for case in _cases():
        k = key(case[0], case[1])
        if k not in seen:
            seen.add(k)
            out.append(case)
    return out


def _by_kind(call, what):  # the kind: the words after the argument's name
    return call.name, what.split(" ", 1)[1]


def _by_argument(call, what):
    return call.name, what.split(" ", 1)[0]


def _check(cases, mode):
    sweep = _sweep()
    wrong = []
    for call, what, args, kwargs in cases:
        problem = sweep.check(call.op, args, kwargs, mode, sweep.undefined_on_cpu(call, what))
        if problem:
            wrong.append(f"{call.name} ({call.origin}) {what}: {problem}")
    assert not wrong, f"{len(wrong)} cases differ from the CPU in {mode}:\n" + "\n".join(wrong)


def test_sweep_reaches_the_index_ops():
    names = {call.name for call, *_ in _cases()}
    for op in ("aten.gather.default", "aten.scatter.src", "aten.index_select.default",
               "aten.index_add.default", "aten.index_reduce.default", "aten.take.default",
               "aten.embedding.default", "aten.nll_loss_forward.default",
               "aten.index.Tensor", "aten.index_put.default", "aten.bincount.default",
               "aten._ctc_loss.default",
               "aten.multilabel_margin_loss_forward.default"):
        assert op in names, op


@pytest.mark.parametrize("mode", ["fused", "strict", "debug"])
def test_one_case_per_overload_and_kind(mode):
    _check(_firsts(_by_kind), mode)


def test_compiled_one_case_per_overload_and_argument():
    _check(_firsts(_by_argument), "compile")
