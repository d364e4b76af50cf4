"""Sweep: every aten call with an index argument, given bad indices, on the CPU and on pjrt.

The calls are generated, not listed: each OpInfo of op_db is run on the CPU on its float32
samples under a dispatch mode that records the aten calls it makes; a call with an index
argument is kept (a tensor of an integer dtype, as gather's `index`, embedding's `indices`,
nll_loss's `target`, one_hot's or bincount's `self`, or an int named `index` in the op's
schema, as select's). Each kept call is replayed with that argument made bad: a negative
index, one past every size, one very negative, and the index in another dtype (int32,
int16, float32). The CPU says what must happen: where it raises, pjrt must raise (at the op
in debug mode, by the next synchronization otherwise); where it wraps a negative index or
accepts another dtype, pjrt must give its values.

    python tools/index_sweep.py [--modes strict,fused,debug,compile] [--ops gather,take]

prints each case where pjrt differs; tests/lowering/test_index_sweep.py runs it in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
BIG = 1 << 14  # past every size of op_db's samples, small enough that a result of that
# many elements (bincount, one_hot) stays small
# ops whose integer argument is data, not an index (a bad value there is not an index error)
NOT_INDEX = {"aten.lift_fresh.default", "aten._to_copy.default", "aten.clone.default",
             "aten.copy_.default", "aten.detach.default", "aten.alias.default"}
# arguments the CPU's own kernels read unchecked (LAPACK's pivots: a bad one corrupts the
# heap of the process on the CPU itself), so the CPU cannot say what must happen
UNCHECKED_ON_CPU = {"pivots", "LU_pivots", "info"}
# index arguments that the CPU's kernel reads (or writes at) without a check, for the bad
# values named: its result is whatever memory lies there, so pjrt must raise (the CPU is not
# run on them: a write out of bounds would corrupt this process)
UNDEFINED_ON_CPU: dict[tuple[str, str], tuple[frozenset, str]] = {
    **{(f"aten.max_pool{n}d_with_indices_backward.default", "indices"): (
        frozenset({"very negative", "past the end"}),
        "the CPU adds the gradient at the index unchecked (it skips -1 alone)")
       for n in (2, 3)},
    **{(f"aten._ctc_loss.{overload}", "targets"): (
        frozenset({"negative", "very negative", "past the end"}),
        "the CPU reads log_probs at each target label unchecked")
       for overload in ("default", "Tensor")},
}
# aten overloads the OpInfos reach that allocate by an index's value: one past the sizes
# would ask for a result of `BIG` rows per element (not an index error on any device)
SIZE_FROM_VALUE = {"aten.repeat_interleave.Tensor", "aten.repeat_interleave.self_Tensor"}


@dataclasses.dataclass(frozen=True)
class Call:
    """One recorded aten call: the overload, its arguments, and which are indices."""
    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    index_paths: tuple  # (i, None, item) of a positional, (None, name, item) of a keyword;
    # item: the position in a list of tensors, or None
    source: tuple[str, str]  # the OpInfo that made it: (name, variant_test_name)

    @property
    def name(self) -> str:
        return str(self.op)

    @property
    def origin(self) -> str:
        return ".".join(part for part in self.source if part)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def _is_index_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in INT_DTYPES and x.numel() > 0


def _index_paths(op, args, kwargs) -> tuple:
    """(position, keyword, list item) of each index argument: an integer tensor, one in a
    list of tensors (index's and index_put's `indices`), or an int named `index`."""
    schema = op._schema
    if torch.Tag.pointwise in op.tags or torch.Tag.reduction in op.tags:
        return ()  # an elementwise op's or a reduction's integers are data
    view = any(r.alias_info is not None for r in schema.returns)
    paths = []
    named = [(i, None, a.name, value) for i, (a, value) in enumerate(zip(schema.arguments,
                                                                            args))]
    named += [(None, name, name, value) for name, value in kwargs.items()]
    for i, kw, name, value in named:
        if name in UNCHECKED_ON_CPU or (view and name == "self"):
            continue  # (a view's input is data: unbind's, unsqueeze's)
        if _is_index_tensor(value) or (name == "index" and type(value) is int):
            paths.append((i, kw, None))
        elif isinstance(value, (list, tuple)):
            paths += [(i, kw, j) for j, v in enumerate(value) if _is_index_tensor(v)]
    return tuple(paths)


def _sample_dtype(info) -> torch.dtype | None:
    """float32 where the OpInfo takes it (its integer tensors are then indices); else int64
    for ops that are not elementwise (bincount, one_hot, unravel_index: their integer input
    is the index); None: the OpInfo is left out."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, UnaryUfuncInfo

    dtypes = info.supported_dtypes("cpu")
    if torch.float32 in dtypes:
        return torch.float32
    if torch.int64 in dtypes and not isinstance(info, (UnaryUfuncInfo, BinaryUfuncInfo)):
        return torch.int64
    return None


def _recorded(info, dtype) -> Iterator[tuple]:
    """(aten overload, args, kwargs) of each call the OpInfo's first samples make on the CPU
    (the random samples seeded, so that a run replays the same calls)."""
    torch.manual_seed(0)
    try:
        samples = list(itertools.islice(info.sample_inputs("cpu", dtype), 6))
    except Exception:  # noqa: BLE001 (a broken sample generator is op_db's)
        return
    for sample in samples:
        rec = _Recorder()
        try:
            with warnings.catch_warnings(), rec:
                warnings.simplefilter("ignore")
                info.op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001
            continue
        yield from rec.calls


def _opinfos(only: set[str] | None, sources: set[tuple[str, str]] | None):
    from torch.testing._internal.common_methods_invocations import op_db

    for info in op_db:
        if only and info.name not in only:
            continue
        if sources is not None and (info.name, info.variant_test_name) not in sources:
            continue
        dtype = _sample_dtype(info)
        if dtype is not None:
            yield info, dtype


def calls(only: set[str] | None = None, per_op: int = 3,
          sources: set[tuple[str, str]] | None = None) -> list[Call]:
    """The recorded aten calls with an index argument, at most `per_op` per overload, from
    every OpInfo of op_db (or those named by `sources`: (name, variant_test_name))."""
    seen: dict[tuple, int] = {}
    found: list[Call] = []
    for info, dtype in _opinfos(only, sources):
        for func, args, kwargs in _recorded(info, dtype):
            name = str(func)
            if name in NOT_INDEX or func._schema.is_mutable and "out" in kwargs:
                continue
            paths = _index_paths(func, args, kwargs)
            # one call per overload and rank of its tensors (0-d inputs take other paths)
            ranks = tuple(a.dim() for a in args if isinstance(a, torch.Tensor))
            if not paths or (name, ranks) in seen or \
                    sum(k[0] == name for k in seen) >= per_op:
                continue
            seen[(name, ranks)] = 1
            clone = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x,
                             (args, kwargs))
            found.append(Call(func, clone[0], clone[1], paths,
                              (info.name, info.variant_test_name)))
    return found


# The OpInfos whose samples make calls with an index argument, found by walking all of
# op_db (`--write-sources`); CI walks only these when its torch is the one they were found
# with (the full walk takes a minute of sample making).
SOURCES_FILE = Path(__file__).with_name("index_sweep_sources.json")


def cached_sources() -> set[tuple[str, str]] | None:
    """The OpInfos of SOURCES_FILE, or None where it was written for another torch."""
    if not SOURCES_FILE.exists():
        return None
    data = json.loads(SOURCES_FILE.read_text())
    if data.get("torch") != torch.__version__:
        return None
    return {tuple(s) for s in data["opinfos"]}


def write_sources(found: list[Call]) -> None:
    opinfos = sorted({c.source for c in found})
    rows = ",\n".join(f"  {json.dumps(list(s))}" for s in opinfos)
    SOURCES_FILE.write_text(f'{{"torch": {json.dumps(torch.__version__)}, "opinfos": [\n'
                            f'{rows}\n]}}\n')


def _bad_values(value, name: str) -> Iterator[tuple[str, object]]:
    if type(value) is int:
        yield "negative", -1
        yield "past the end", BIG
        yield "very negative", -BIG
        return
    flat = value.reshape(-1)

    def with_first(v):
        out = flat.clone()
        out[0] = v
        return out.reshape(value.shape)

    if value.dtype != torch.uint8:
        yield "negative", with_first(-1)
        yield "very negative", with_first(-BIG if value.dtype not in (torch.int8,) else -128)
    if name not in SIZE_FROM_VALUE and value.dtype not in (torch.int8, torch.uint8):
        yield "past the end", with_first(BIG)
    for dtype in (torch.int32, torch.int16, torch.float32):
        if dtype != value.dtype:
            yield f"as {str(dtype).removeprefix('torch.')}", value.to(dtype)


def cases(found: list[Call]) -> Iterator[tuple[Call, str, tuple, dict]]:
    """(call, description, args, kwargs) of each bad-index replay."""
    for call in found:
        for i, kw, j in call.index_paths:
            holder = call.args[i] if kw is None else call.kwargs[kw]
            value = holder if j is None else holder[j]
            arg_name = call.op._schema.arguments[i].name if kw is None else kw
            if j is not None:
                arg_name += f"[{j}]"
            for what, bad in _bad_values(value, call.name):
                args, kwargs = list(call.args), dict(call.kwargs)
                if j is not None:
                    bad = type(holder)(bad if k == j else v for k, v in enumerate(holder))
                if kw is None:
                    args[i] = bad
                else:
                    kwargs[kw] = bad
                yield call, f"{arg_name} {what}", tuple(args), kwargs


def undefined_on_cpu(call: Call, what: str) -> bool:
    """Whether the CPU's result of this case is undefined (UNDEFINED_ON_CPU)."""
    arg, _, kind = what.partition(" ")
    entry = UNDEFINED_ON_CPU.get((call.name, arg.partition("[")[0]))
    return entry is not None and kind in entry[0]


@contextlib.contextmanager
def _filled_memory() -> Iterator[None]:
    """Memory a kernel leaves unwritten reads as NaN (the parts of _ctc_loss's log_alpha past
    each target, on the CPU and in pjrt's CPU fallback alike), not as what lay there."""
    was = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _clone(tree):
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _run(op, args, kwargs, device: str):
    """(result on the CPU, or None) and (the exception, or None); pjrt results are read."""
    args, kwargs = _clone((args, kwargs)) if device == "cpu" else tree_map(
        lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, (args, kwargs))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = op(*args, **kwargs)
            if device != "cpu":
                out = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, out)
                # the in-place ops' results are their inputs: read those too
                tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, args)
                torch.pjrt.synchronize()
        return out, None
    except Exception as e:  # noqa: BLE001 (what the CPU raises is the reference)
        if device != "cpu":
            _drain()
        return None, e


def _drain() -> None:
    """Errors left pending by a failed case must not land on the next one."""
    for _ in range(3):
        try:
            torch.pjrt.synchronize()
            return
        except Exception:  # noqa: BLE001
            continue


def _same(a, b) -> bool:
    fa, _ = tree_flatten(a)
    fb, _ = tree_flatten(b)
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        try:
            torch.testing.assert_close(x, y, equal_nan=True, atol=1e-5, rtol=1e-5)
        except AssertionError:
            return False
    return True


def check(call_op, args, kwargs, mode: str, undefined: bool = False) -> str:
    """'' where pjrt does what the CPU does with these arguments, else what differs.
    `undefined`: the CPU's result is undefined (undefined_on_cpu): pjrt must raise."""
    import torch_pjrt

    with _filled_memory():
        expected, cpu_error = (None, None) if undefined else _run(call_op, args, kwargs, "cpu")
        op = call_op
        if mode == "compile":
            torch._dynamo.reset()
            op = torch.compile(lambda *a, **k: call_op(*a, **k), backend="pjrt", fullgraph=True)
            got, error = _run(op, args, kwargs, "pjrt")
        else:
            with torch_pjrt.set_eager_mode(mode):
                got, error = _run(op, args, kwargs, "pjrt")
    if undefined:
        return "" if error is not None else ("the CPU's kernel reads this index unchecked; "
                                             "pjrt returns a result, it must raise")
    if mode == "compile" and isinstance(error, (torch._dynamo.exc.Unsupported,
                                                torch._dynamo.exc.TorchRuntimeError)):
        # Dynamo refuses the call, or PyTorch's meta function does while Dynamo traces it,
        # before any backend sees the graph (as under backend="eager")
        return ""
    if cpu_error is not None:
        if error is None:
            return f"the CPU raises {type(cpu_error).__name__}, pjrt returns a result"
        return ""
    if error is not None:
        text = str(error).splitlines()[0][:160] if str(error) else ""
        return f"the CPU returns a result, pjrt raises {type(error).__name__}: {text}"
    if not _same(got, expected):
        return "pjrt's result differs from the CPU's"
    return ""


def sweep(found: list[Call], modes_: list[str],
          verbose: bool = False) -> list[tuple[str, str, str, str, str]]:
    """(op, OpInfo, case, mode, what differs) of each case where pjrt differs."""
    differences = []
    for call, what, args, kwargs in cases(found):
        for mode in modes_:
            if verbose:
                print(f"... {call.name} ({call.origin}) {what} {mode}", flush=True)
            problem = check(call.op, args, kwargs, mode, undefined_on_cpu(call, what))
            if problem:
                differences.append((call.name, call.origin, what, mode, problem))
    return differences


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="strict,fused,debug,compile")
    p.add_argument("--ops", default="", help="OpInfo names (default: all of op_db)")
    p.add_argument("--verbose", action="store_true", help="print each case before it runs")
    p.add_argument("--write-sources", action="store_true",
                   help=f"walk all of op_db and write {SOURCES_FILE.name} (the OpInfos CI "
                   "walks), then stop")
    args = p.parse_args(argv)
    only = set(args.ops.split(",")) if args.ops else None
    found = calls(only)
    if args.write_sources:
        write_sources(found)
        print(f"{SOURCES_FILE}: {len({c.source for c in found})} OpInfos")
        return 0
    n_cases = sum(1 for _ in cases(found))
    print(f"{len(found)} calls with an index argument ({len({c.name for c in found})} "
          f"overloads), {n_cases} bad-index cases", flush=True)
    differences = sweep(found, args.modes.split(","), args.verbose)
    for row in differences:
        print(" | ".join(row), flush=True)
    print(f"{len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
