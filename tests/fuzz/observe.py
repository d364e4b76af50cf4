"""Running a fuzz program on a device, what it observably did, and the differences between
two runs: the exception each line raised, and at the end every tensor variable's values,
dtype, shape, strides, storage offset, aliasing (which variables are the same tensor, share
a storage, have which `_base`), version counter, autograd flags and gradient."""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass, field

import torch

import torch_pjrt

from .programs import Program

_NAME = re.compile(r"^[xv]\d+$")

# What each run observes of a tensor, beyond its values. Under torch.compile, version
# counters are not eager's (Inductor's and AOTAutograd's own differ from eager's and from
# each other's: one bump per mutated input, or none), so that run does not compare them.
FIELDS = ("dtype", "shape", "stride", "offset", "same", "storage", "base", "version",
          "requires_grad", "is_leaf", "grad_fn", "conj", "neg")
COMPILED_FIELDS = tuple(f for f in FIELDS if f != "version")


@dataclass
class Outcome:
    errors: list[str | None]  # per line: the type of the exception it raised, or None
    messages: list[str | None]
    deferred: int | None = None  # the line whose error the synchronization after it raised
    state: dict[str, dict] = field(default_factory=dict)  # per tensor variable, at the end


def run(program: Program, device: str = "cpu", mode: str | None = None,
        expected: Outcome | None = None) -> Outcome:
    """Run `program` line by line (an eager `mode` on pjrt). Where the CPU run (`expected`)
    raised at a line and this one did not, the device is synchronized there: a data-dependent
    error (an index out of range) is reported at the next synchronization, as CUDA does,
    except in debug mode, which must raise at the op."""
    ns: dict = {"torch": torch, "device": device}
    lines = program.all_lines
    out = Outcome([None] * len(lines), [None] * len(lines))
    sync = device != "cpu" and mode != "debug"
    with _quiet(), (torch_pjrt.set_eager_mode(mode) if mode else contextlib.nullcontext()):
        try:
            for i, line in enumerate(lines):
                try:
                    exec(line, ns)
                except Exception as e:  # noqa: BLE001 - compared with the CPU's
                    _note(out, i, e)
                    continue
                if sync and expected is not None and expected.errors[i] is not None:
                    try:
                        torch.pjrt.synchronize()
                    except Exception as e:  # noqa: BLE001
                        _note(out, i, e)
                        out.deferred = i
                        return out  # later values are not comparable (as after CUDA's)
            out.state = observe(ns)
        finally:
            if device != "cpu":
                with contextlib.suppress(Exception):
                    torch.pjrt.synchronize()
    return out


def run_compiled(program: Program, device: str = "pjrt", backend: str = "pjrt") -> Outcome:
    """The program's statements as one function compiled with torch.compile(backend=...),
    called on inputs made in eager mode (Program.source("compile") is the same script)."""
    ns: dict = {"torch": torch, "device": device}
    last = len(program.all_lines) - 1
    out = Outcome([None] * (last + 1), [None] * (last + 1))
    with _quiet():
        try:
            for line in program.inputs:
                exec(line, ns)
            exec(program.function(), ns)
            fn = torch.compile(ns["fuzz_program"], backend=backend)
            out.state = observe(fn(*[ns[n] for n in program.input_names]))
        except Exception as e:  # noqa: BLE001 - the CPU ran every line
            _note(out, last, e)
        finally:
            torch._dynamo.reset()
            if device != "cpu":
                with contextlib.suppress(Exception):
                    torch.pjrt.synchronize()
    return out


def _note(out: Outcome, i: int, e: Exception) -> None:
    out.errors[i] = type(e).__name__
    out.messages[i] = str(e).split("\n")[0][:300]


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def observe(ns: dict) -> dict[str, dict]:
    """Every tensor variable of a program's namespace, as plain data."""
    names = [n for n, v in ns.items() if _NAME.match(n) and isinstance(v, torch.Tensor)]
    first_of: dict[int, str] = {}
    storage_of: dict[int, str] = {}
    state = {}
    for n in names:
        t = ns[n]
        first_of.setdefault(id(t), n)
        storage_of.setdefault(t.untyped_storage()._cdata, n)
    for n in names:
        t = ns[n]
        base = t._base
        state[n] = {
            "dtype": t.dtype, "shape": tuple(t.shape), "stride": t.stride(),
            "offset": t.storage_offset(),
            "same": first_of[id(t)], "storage": storage_of[t.untyped_storage()._cdata],
            "base": None if base is None else first_of.get(id(base), "another tensor"),
            "version": t._version, "requires_grad": t.requires_grad,
            "conj": t.is_conj(), "neg": t.is_neg(),
            "value": _host(t),
        }
        try:  # raises for a view of a multi-output view op whose base was written in place
            grad_fn, leaf = t.grad_fn, t.is_leaf
        except RuntimeError as e:
            state[n].update(is_leaf=type(e).__name__, grad_fn=type(e).__name__, grad=None)
            continue
        state[n].update(is_leaf=leaf,
                        grad_fn=None if grad_fn is None else type(grad_fn).__name__,
                        grad=_host(t.grad) if (leaf or t.retains_grad) else None)
    return state


def _host(t: torch.Tensor | None):
    """A tensor's values on the CPU (conjugate and negative bits resolved), or the name of
    the exception reading it raised."""
    if t is None:
        return None
    try:
        return t.detach().cpu().clone().resolve_conj().resolve_neg()
    except Exception as e:  # noqa: BLE001
        return f"reading it raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def differences(expected: Outcome, actual: Outcome, lines: tuple[str, ...],
                fields: tuple[str, ...] = FIELDS) -> list[str]:
    """What `actual` (pjrt) did differently from `expected` (the CPU), one line each."""
    diffs = []
    last = len(lines) if actual.deferred is None else actual.deferred + 1
    for i, (e, a) in enumerate(zip(expected.errors[:last], actual.errors[:last])):
        if e != a:
            diffs.append(f"line {i + 1} `{lines[i]}`: CPU {_did(e, expected.messages[i])}, "
                         f"pjrt {_did(a, actual.messages[i])}")
    if diffs or actual.deferred is not None:
        return diffs  # what follows a different error is not comparable
    for name, e in expected.state.items():
        a = actual.state.get(name)
        if a is None:
            diffs.append(f"{name}: not a tensor on pjrt")
            continue
        diffs += [f"{name}.{k}: pjrt {a[k]!r}, CPU {e[k]!r}" for k in fields if a[k] != e[k]]
        for k in ("value", "grad"):
            problem = _values_differ(a[k], e[k])
            if problem:
                diffs.append(f"{name}.{k if k == 'grad' else 'values'}: {problem}")
    return diffs


def _did(error: str | None, message: str | None) -> str:
    return f"raised {error} ({message})" if error else "ran"


def _values_differ(actual, expected) -> str | None:
    if actual is None or expected is None or isinstance(actual, str) or \
            isinstance(expected, str):
        return None if (actual is None) == (expected is None) and \
            (isinstance(actual, str) == isinstance(expected, str)) else \
            f"pjrt {_short(actual)}, CPU {_short(expected)}"
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as e:
        return f"pjrt {_short(actual)}, CPU {_short(expected)} ({str(e).splitlines()[0]})"
    return None


def _short(v) -> str:
    if isinstance(v, torch.Tensor):
        return str(v.tolist()) if v.numel() <= 24 else f"tensor of shape {tuple(v.shape)}"
    return repr(v)
