"""OpInfo conformance: every op of PyTorch's op_db run on the CPU and on pjrt, compared.

For each OpInfo and each of its sample inputs the op runs on the CPU (the
reference) and on the `pjrt` device, forward and (for autograd ops) backward:
the gradients of `sum(out * w)` over the floating outputs, with a fixed random
weight `w`, with respect to the inputs that require grad. Each op and
direction gets one outcome:

- `pass`: every sample matches the CPU (values, shapes, dtypes; or the CPU
  raised and pjrt raised the same exception type);
- `fallback`: every sample matches, but some ATen op ran on the CPU fallback;
- `fail`: a wrong result, an unexpected exception, or the per-op time limit;
- `skip`: nothing to run (no samples for the dtype, no autograd, ...).

The sweep never stops on one op: every exception is recorded, each op runs
under a time limit, and fallback warnings are silenced. The test suite
(tests/lowering/test_opinfo.py) and `python -m torch_pjrt ops` both use this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = "pjrt"
DIRECTIONS = ("forward", "backward")
STATUSES = ("pass", "fallback", "fail", "skip")

# Default tolerances by dtype: assert_close's own for float32 (atol, rtol).
DEFAULT_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1.3e-6),
    torch.complex64: (1e-5, 1.3e-6),
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-5, 1e-3),
    torch.bfloat16: (1e-5, 1.6e-2),
}

# Gradients are sums of many terms whose order and fusion differ between the
# CPU kernels and XLA; their floor is looser (atol, rtol).
DEFAULT_GRAD_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
}

# OpInfo tests whose tolerance overrides say "this op is imprecise when two
# implementations are compared" (rather than about gradcheck or jit).
_TOLERANCE_TESTS = frozenset({
    None, "test_compare_cpu", "test_comprehensive", "test_noncontiguous_samples",
    "test_variant_consistency_eager", "test_output_match", "test_output_grad_match", "test_out",
    "test_quick", "test_backward", "test_grad", "test_vjp",
})

# Ops whose results are imprecise beyond what their OpInfo says: long float32
# accumulations whose order XLA chooses (atol, rtol).
RELAXED_TOLERANCE: dict[str, tuple[float, float]] = {
    "fft.hfft2": (3e-5, 1.3e-6),  # sums of 360 terms of magnitude ~10: 1.3e-5 apart
}

# Sample arguments that PyTorch requires on the CPU: positions in sample.args
# left there when the rest of the sample moves to pjrt.
CPU_ARGS: dict[str, tuple[int, ...]] = {
    "tensor_split": (0,),  # a tensor indices_or_sections must be a CPU tensor
}

# Ops whose values cannot be compared with the CPU: random numbers or
# uninitialized memory. Their results are compared by shape, dtype and device.
UNCOMPARABLE: dict[str, str] = {
    **{name: "uninitialized memory" for name in (
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
        "new_empty_strided", "resize_", "resize_as_")},
    **{name: "random numbers (the pjrt generator is not the CPU's)" for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
        "normal", "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randint",
        "randint_like", "randn", "randn_like", "nn.functional.alpha_dropout",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout.with_train", "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d", "nn.functional.rrelu", "svd_lowrank",
        "pca_lowrank", "torch.ops.aten._flash_attention_forward",
        "torch.ops.aten._efficient_attention_forward")},
}




def _sdpa_dropout(sample) -> bool:
    return sample.kwargs.get("dropout_p", 0.0) > 0


def _mha_dropout(sample) -> bool:
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight,
    # in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, ...): args[9] is dropout_p.
    return sample.kwargs.get("training", True) and len(sample.args) > 9 and sample.args[9] > 0


# Ops some of whose samples are random (dropout inside): those samples are
# compared by shape, dtype and device only.
RANDOM_SAMPLES: dict[str, Callable[[Any], bool]] = {
    "nn.functional.scaled_dot_product_attention": _sdpa_dropout,
    "nn.functional.multi_head_attention_forward": _mha_dropout,
}


# ------------------------------------------------------------------- results
@dataclass
class Outcome:
    """How one op did in one direction."""

    status: str  # one of STATUSES
    reason: str = ""  # why it failed or was skipped; the fallback ops for "fallback"
    samples: int = 0  # samples run (fewer than total when capped, or when one failed)
    total: int = 0  # samples generated
    cpu_raised: int = 0  # samples where the CPU reference raised (and pjrt did the same)
    fallbacks: tuple[str, ...] = ()  # ATen ops that ran on the CPU fallback
    seconds: float = 0.0


@dataclass
class OpResult:
    name: str  # OpInfo name, plus ".variant" when it has one
    forward: Outcome
    backward: Outcome

    def outcome(self, direction: str) -> Outcome:
        return getattr(self, direction)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "forward": dataclasses.asdict(self.forward),
                "backward": dataclasses.asdict(self.backward)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> OpResult:
        def outcome(o):
            return Outcome(**{**o, "fallbacks": tuple(o.get("fallbacks", ()))})

        return OpResult(d["name"], outcome(d["forward"]), outcome(d["backward"]))


class SampleFailure(Exception):
    """A sample's pjrt result differs from the CPU's (the message says how)."""


class OpTimeout(BaseException):
    """The op ran past its time limit (a BaseException, so that the machinery's `except
    Exception` clauses let it through, as they do KeyboardInterrupt)."""


# ------------------------------------------------------------------ op_db
def op_name(opinfo) -> str:
    """The name an op has in reports and the known-failure lists: name[.variant]."""
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def all_ops() -> list:
    """Every OpInfo of PyTorch's op_db (importing it takes a few seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def select_ops(names: Iterable[str] | None = None) -> list:
    """The OpInfos named (name[.variant]), in op_db order; all of op_db for None."""
    ops = all_ops()
    if names is None:
        return ops
    by_name = {op_name(o): o for o in ops}
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise KeyError(f"not in op_db: {', '.join(unknown)} (names are OpInfo name[.variant], "
                       "e.g. 'add', 'div.floor_rounding', 'nn.functional.conv2d')")
    return [by_name[n] for n in wanted]


def tolerance(opinfo, dtype: torch.dtype = torch.float32,
              direction: str = "forward") -> tuple[float, float]:
    """(atol, rtol): the default for `dtype` (and direction), raised to the OpInfo's own
    overrides."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    atol, rtol = DEFAULT_TOLERANCE.get(dtype, (1e-5, 1.3e-6))
    if direction == "backward":
        atol, rtol = DEFAULT_GRAD_TOLERANCE.get(dtype, (atol, rtol))
    for info in opinfo.decorators:
        decorators = getattr(info, "decorators", [info])
        if getattr(info, "test_name", None) not in _TOLERANCE_TESTS:
            continue
        dtypes = getattr(info, "dtypes", None)
        if dtypes is not None and dtype not in dtypes:
            continue
        if getattr(info, "active_if", True) is False:
            continue
        for d in decorators:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
            elif isinstance(d, precisionOverride) and dtype in d.d:
                atol = max(atol, d.d[dtype])
    extra = RELAXED_TOLERANCE.get(op_name(opinfo))
    if extra is not None:
        atol, rtol = max(atol, extra[0]), max(rtol, extra[1])
    return atol, rtol


# ----------------------------------------------------------------- running
def to_pjrt(sample, keep_on_cpu: tuple[int, ...] = (), aliasing: bool = False):
    """The sample with its tensors copied to pjrt (grad-requiring ones stay leaves that
    require grad); CPU devices named in the arguments (factories' device=, Tensor.to) become
    pjrt. `aliasing`: tensors sharing a CPU storage share a pjrt one, with their own strides
    and offsets (each is otherwise copied into a storage of its own)."""
    from torch.testing._internal.opinfo.core import SampleInput

    storages: dict[tuple, torch.Tensor] = {}
    moved: dict[int, torch.Tensor] = {}  # a tensor passed twice stays one tensor

    def same_layout(x):
        if id(x) in moved:
            return moved[id(x)]
        s = x.untyped_storage()
        base = storages.get((s.data_ptr(), x.dtype))
        if base is None:
            whole = torch.empty(0, dtype=x.dtype).set_(s, 0, (s.nbytes() // x.element_size(),))
            base = storages[(s.data_ptr(), x.dtype)] = whole.detach().to(DEVICE)
        moved[id(x)] = base.as_strided(x.shape, x.stride(), x.storage_offset())
        return moved[id(x)]

    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type != "meta":  # (meta: on purpose)
            y = same_layout(x) if aliasing and x.layout == torch.strided else \
                x.detach().to(DEVICE)
            return y.requires_grad_(x.requires_grad) if x.requires_grad else y
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(DEVICE)
        if isinstance(x, str) and x == "cpu":
            return DEVICE
        return x

    inp, args, kwargs = tree_map(move, (sample.input, sample.args, sample.kwargs))
    args = tuple(a if i not in keep_on_cpu else sample.args[i] for i, a in enumerate(args))
    return SampleInput(inp, args=args, kwargs=kwargs, name=sample.name,
                       output_process_fn_grad=sample.output_process_fn_grad,
                       broadcasts_input=sample.broadcasts_input)


def _call(opinfo, sample) -> Any:
    return sample.output_process_fn_grad(opinfo(sample.input, *sample.args, **sample.kwargs))


def _call_on_pjrt(opinfo, sample) -> Any:
    """The op on the pjrt sample; a call with no tensor at all (a factory without device=)
    runs with pjrt as the default device, so its result is made where the test looks."""
    if any(isinstance(t, torch.Tensor) for t in tree_flatten(
            [sample.input, sample.args, sample.kwargs])[0]):
        return _call(opinfo, sample)
    with torch.device(DEVICE):
        return _call(opinfo, sample)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _mismatch(e: AssertionError) -> str:
    """A short description of an assert_close failure."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    keep = [ln for ln in lines if ln.startswith(("Mismatched", "Greatest absolute", "Expected",
                                                 "Absolute difference"))]
    head = lines[0] if lines else "values differ"
    return " ".join([head] + keep)[:300]


def _compare(actual: Any, expected: Any, tol: tuple[float, float], shape_only: bool,
             where: str = "output") -> None:
    """Raise SampleFailure unless the pjrt result `actual` matches the CPU's `expected`."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise SampleFailure(f"{where}: expected a tensor, got {type(actual).__name__}")
        if actual.device.type != DEVICE:
            raise SampleFailure(f"{where}: result on {actual.device}, expected {DEVICE}")
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            raise SampleFailure(f"{where}: got {actual.dtype}{list(actual.shape)}, expected "
                                f"{expected.dtype}{list(expected.shape)}")
        if shape_only or expected.layout != torch.strided:
            return
        try:
            torch.testing.assert_close(actual.cpu(), expected, atol=tol[0], rtol=tol[1],
                                       equal_nan=True)
        except AssertionError as e:
            raise SampleFailure(f"{where}: {_mismatch(e)}") from None
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise SampleFailure(f"{where}: expected a sequence of {len(expected)}, got "
                                f"{type(actual).__name__}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, tol, shape_only, f"{where}[{i}]")
    elif isinstance(expected, (bool, int, float, complex)) and not shape_only:
        try:
            torch.testing.assert_close(actual, expected, atol=tol[0], rtol=tol[1],
                                       equal_nan=True)
        except (AssertionError, TypeError) as e:
            raise SampleFailure(f"{where}: {actual!r} != {expected!r} ({first_line(e)})") from None
    elif not shape_only and actual != expected:
        raise SampleFailure(f"{where}: {actual!r} != {expected!r}")


def sync_result(result: Any) -> None:
    """Wait for the pjrt result (so device-side errors and lazy failures surface here)."""
    for t in tree_flatten(result)[0]:
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE and t.layout == torch.strided:
            t.detach().cpu()


def _run_both(cpu_fn: Callable[[], Any], pjrt_fn: Callable[[], Any]):
    """(CPU result, pjrt result, both raised): when the CPU reference raises, pjrt must
    raise the same exception type (then the sample passes with nothing to compare)."""
    try:
        expected, cpu_error = cpu_fn(), None
    except Exception as e:  # noqa: BLE001 - the reference may legitimately raise
        expected, cpu_error = None, e
    try:
        actual = pjrt_fn()
        sync_result(actual)
    except Exception as e:  # noqa: BLE001
        if cpu_error is not None and isinstance(e, type(cpu_error)):
            return None, None, True
        if cpu_error is not None:
            raise SampleFailure(f"CPU raised {first_line(cpu_error)}; pjrt raised "
                                f"{first_line(e)}") from None
        raise
    if cpu_error is not None:
        raise SampleFailure(f"CPU raised {first_line(cpu_error)}; pjrt did not")
    return expected, actual, False


def _float_leaves(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _weights(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(_real(o).shape, generator=g, dtype=_real(o).dtype) for o in outs]


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _loss(outs: list[torch.Tensor], weights: list[torch.Tensor]) -> torch.Tensor:
    total = None
    for o, w in zip(outs, weights):
        term = (_real(o) * w.to(o.device)).sum()
        total = term if total is None else total + term
    return total


def _grads(opinfo, sample, weights_seed: int, counter: _FallbackCounter | None = None):
    leaves = _float_leaves([sample.input, sample.args, sample.kwargs])
    outs = _differentiable(_call(opinfo, sample))
    if not outs or not leaves:
        return None
    loss = _loss(outs, _weights(outs, weights_seed))
    with counter or contextlib.nullcontext():
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return list(grads)


class _FallbackCounter:
    """The ATen ops that took the CPU fallback inside the `with` blocks."""

    def __init__(self):
        self.ops: set[str] = set()

    def __enter__(self):
        self._before = _fallback_counts()
        return self

    def __exit__(self, *exc):
        after = _fallback_counts()
        self.ops.update(op for op, n in after.items() if n > self._before.get(op, 0))
        return False


def _fallback_counts() -> dict[str, int]:
    from . import counters

    return dict(counters.metrics()["cpu_fallbacks"])


def _forward_sample(opinfo, sample, tol, shape_only, counter) -> bool:
    dev = to_pjrt(sample, CPU_ARGS.get(op_name(opinfo), ()))  # before the CPU run, which
    # may modify the sample in place

    def pjrt_run():
        with counter:
            return _call_on_pjrt(opinfo, dev)

    expected, actual, raised = _run_both(lambda: _call(opinfo, sample), pjrt_run)
    if not raised:
        _compare(actual, expected, tol, shape_only)
    return raised


def _backward_sample(opinfo, sample, tol, shape_only, counter, seed) -> bool | None:
    """True: both raised; False: compared; None: nothing to differentiate."""
    dev = to_pjrt(sample, CPU_ARGS.get(op_name(opinfo), ()))
    expected, actual, raised = _run_both(lambda: _grads(opinfo, sample, seed),
                                         lambda: _grads(opinfo, dev, seed, counter))
    if raised:
        return True
    if expected is None:
        return None
    if actual is None:
        raise SampleFailure("pjrt outputs do not require grad")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            raise SampleFailure(f"grad[{i}]: pjrt {'None' if a is None else 'a tensor'}, CPU "
                                f"{'None' if e is None else 'a tensor'}")
        if e is not None:
            _compare(a, e, tol, shape_only, f"grad[{i}]")
    return False


@contextlib.contextmanager
def time_limit_of(seconds: float | None) -> Iterator[None]:
    """Raise OpTimeout in the main thread after `seconds` (no limit for None or 0)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise OpTimeout(f"ran past the {seconds:g} s time limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings (fallback reports included) without using up the once-per-op
    fallback report for code that runs later in the same process."""
    from .eager import fallback

    warned = set(getattr(fallback, "_warned", ()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            if hasattr(fallback, "_warned"):
                fallback._warned.intersection_update(warned)


def run_direction(opinfo, direction: str, dtype: torch.dtype = torch.float32, *,
                  time_limit: float | None = 120.0, max_samples: int | None = None,
                  seed: int = 0) -> Outcome:
    """Run one op in one direction ("forward" or "backward") over its sample inputs."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}; accepted: {DIRECTIONS}")
    backward = direction == "backward"
    if backward and not opinfo.supports_autograd:
        return Outcome("skip", "no autograd support")
    supported = opinfo.supported_backward_dtypes("cpu") if backward else \
        opinfo.supported_dtypes("cpu")
    if dtype not in supported:
        return Outcome("skip", f"{str(dtype).removeprefix('torch.')} not supported on the CPU")

    name = op_name(opinfo)
    tol = tolerance(opinfo, dtype, direction)
    counter = _FallbackCounter()
    start = time.perf_counter()
    outcome = Outcome("pass")
    compared = 0
    current = 0  # index of the sample being run, in the op's full sample list
    try:
        with quiet(), time_limit_of(time_limit):
            torch.manual_seed(seed)
            try:
                samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=backward))
            except Exception as e:  # noqa: BLE001 - a CPU-side problem, not ours
                return Outcome("skip", f"sample inputs raised {first_line(e)}")
            outcome.total = len(samples)
            random_sample = RANDOM_SAMPLES.get(name)
            for current, sample in spread(list(enumerate(samples)), max_samples):
                shape_only = name in UNCOMPARABLE or (random_sample is not None
                                                      and random_sample(sample))
                try:
                    if backward:
                        raised = _backward_sample(opinfo, sample, tol, shape_only, counter,
                                                  seed + current)
                    else:
                        raised = _forward_sample(opinfo, sample, tol, shape_only, counter)
                except SampleFailure as e:
                    outcome.status, outcome.reason = "fail", f"sample {current}: {e}"
                    break
                finally:
                    outcome.samples += 1
                if raised is None:
                    continue
                compared += 1
                outcome.cpu_raised += bool(raised)
    except OpTimeout as e:
        outcome.status = "fail"
        outcome.reason = (f"timeout: {e} at sample {current} of {outcome.total} (the "
                          f"{outcome.samples} before passed)")
    except Exception as e:  # noqa: BLE001 - one bad op must not stop the sweep
        outcome.status = "fail"
        outcome.reason = f"sample {current}: {first_line(e)}"
    finally:
        outcome.seconds = round(time.perf_counter() - start, 3)
    _clear_pending_checks()
    outcome.fallbacks = tuple(sorted(counter.ops))
    if outcome.status == "pass":
        if outcome.total == 0:
            return dataclasses.replace(outcome, status="skip", reason="no sample inputs")
        if compared == 0:
            return dataclasses.replace(outcome, status="skip",
                                       reason="no sample with an input and output to "
                                              "differentiate")
        if outcome.fallbacks:
            outcome.status = "fallback"
            outcome.reason = "CPU fallback: " + ", ".join(outcome.fallbacks)
    return outcome


def spread(samples: list, n: int | None) -> list:
    """At most `n` of `samples`, evenly spaced (the first and the last kept): sample lists
    put their edge cases (empty, 0-d, broadcasting, non-contiguous) towards the end."""
    if n is None or len(samples) <= n:
        return samples
    if n <= 1:
        return samples[:n]
    step = (len(samples) - 1) / (n - 1)
    return [samples[round(i * step)] for i in range(n)]


def _clear_pending_checks() -> None:
    """Drop device-side check results an aborted op left queued (they are not the next op's)."""
    from .lowering import checks

    with contextlib.suppress(Exception):
        checks.raise_pending()


def release_compiled() -> None:
    """Drop the compiled programs of the ops run so far (a sweep of op_db compiles tens of
    thousands; keeping them all would take gigabytes)."""
    import gc

    import jax

    from .eager import op_cache

    op_cache.cache.clear()
    jax.clear_caches()
    gc.collect()


def run_op(opinfo, dtype: torch.dtype = torch.float32, *, time_limit: float | None = 120.0,
           max_samples: int | None = None, directions: Iterable[str] = DIRECTIONS) -> OpResult:
    """Both directions of one op."""
    directions = tuple(directions)
    res = {}
    for d in DIRECTIONS:
        if d in directions:
            res[d] = run_direction(opinfo, d, dtype, time_limit=time_limit,
                                   max_samples=max_samples)
        else:
            res[d] = Outcome("skip", "not run")
    return OpResult(op_name(opinfo), res["forward"], res["backward"])


def sweep(opinfos: Iterable, dtype: torch.dtype = torch.float32, *,
          time_limit: float | None = 120.0, max_samples: int | None = None,
          on_result: Callable[[OpResult], None] | None = None) -> list[OpResult]:
    """Run every op; `on_result` is called after each (for progress and checkpoints)."""
    results = []
    for opinfo in opinfos:
        r = run_op(opinfo, dtype, time_limit=time_limit, max_samples=max_samples)
        release_compiled()
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results


# ------------------------------------------------------------ known failures
def verdict(name: str, direction: str, outcome: Outcome,
            known: dict[str, dict[str, str]] | None = None) -> str:
    """How an outcome stands against the known-failure lists:

    "ok" (passed, fell back or skipped, not listed; or listed and passing only a subset of
    the samples), "expected" (failed, listed), "unexpected" (failed, not listed), "fixed"
    (listed, but passes every sample now: shrink the list).
    """
    if known is None:
        from .conformance_known_failures import KNOWN_FAILURES as known
    listed = name in known[direction]
    if outcome.status == "fail":
        return "expected" if listed else "unexpected"
    if listed and outcome.status in ("pass", "fallback") and outcome.samples == outcome.total:
        return "fixed"
    return "ok"


# ----------------------------------------------------------------- reports
@dataclass
class Totals:
    ops: int = 0
    forward: dict[str, int] = field(default_factory=dict)
    backward: dict[str, int] = field(default_factory=dict)
    autograd_ops: int = 0  # ops whose backward was not skipped
    seconds: float = 0.0

    def percent(self, direction: str, *statuses: str) -> float:
        counts = getattr(self, direction)
        denom = self.ops if direction == "forward" else self.autograd_ops
        return 100.0 * sum(counts.get(s, 0) for s in statuses) / denom if denom else 0.0


def totals(results: list[OpResult], seconds: float = 0.0) -> Totals:
    t = Totals(ops=len(results), seconds=seconds)
    for d in DIRECTIONS:
        counts = dict.fromkeys(STATUSES, 0)
        for r in results:
            counts[r.outcome(d).status] += 1
        setattr(t, d, counts)
    t.autograd_ops = sum(r.backward.status != "skip" for r in results)
    return t


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[OpResult], t: Totals, *, dtype: torch.dtype = torch.float32,
             known: dict[str, dict[str, str]] | None = None, header: str = "") -> str:
    """The coverage report: totals, then one row per op."""
    if known is None:
        from .conformance_known_failures import KNOWN_FAILURES as known
    dt = str(dtype).removeprefix("torch.")
    fwd, bwd = t.forward, t.backward
    lines = [
        "# Op coverage: PyTorch OpInfo on pjrt",
        "",
        "Generated by `python -m torch_pjrt ops --report` (torch_pjrt/conformance.py): every "
        f"OpInfo of PyTorch's `op_db` on {dt} sample inputs, run on the CPU and on `pjrt`, "
        "compared forward and backward. `fallback`: correct, but some ATen op ran on the "
        "CPU fallback; `fail`: wrong result, unexpected error or time limit; `skip`: nothing "
        f"to run (no {dt} samples, no autograd).",
        "",
    ]
    if header:
        lines += [header, ""]
    lines += [
        "| | ops | pass | fallback | fail | skip | pass % | pass+fallback % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| forward ({dt}) | {t.ops} | {fwd['pass']} | {fwd['fallback']} | {fwd['fail']} | "
        f"{fwd['skip']} | {t.percent('forward', 'pass'):.1f} | "
        f"{t.percent('forward', 'pass', 'fallback'):.1f} |",
        f"| backward (autograd ops) | {t.autograd_ops} | {bwd['pass']} | {bwd['fallback']} | "
        f"{bwd['fail']} | - | {t.percent('backward', 'pass'):.1f} | "
        f"{t.percent('backward', 'pass', 'fallback'):.1f} |",
        "",
        f"- forward: **{t.percent('forward', 'pass'):.1f}%** of the {t.ops} op_db ops pass on "
        f"{dt} without the CPU ({t.percent('forward', 'pass', 'fallback'):.1f}% counting CPU "
        "fallbacks);",
        f"- backward: **{t.percent('backward', 'pass'):.1f}%** of the {t.autograd_ops} autograd "
        f"ops pass ({t.percent('backward', 'pass', 'fallback'):.1f}% counting CPU fallbacks);",
        f"- ops falling back to the CPU: {fwd['fallback']} forward, {bwd['fallback']} backward;",
        f"- wall time: {t.seconds / 60:.1f} min.",
        "",
        "Known failures (torch_pjrt/conformance_known_failures.py) are marked *known*; a listed "
        "op that passes now is marked **fixed** (remove it from the list), an unlisted failure "
        "**new**.",
        "",
        "| op | forward | backward | notes |",
        "| --- | --- | --- | --- |",
    ]
    marks = {"expected": " *known*", "unexpected": " **new**", "fixed": " **fixed**", "ok": ""}
    for r in sorted(results, key=lambda r: r.name):
        cells, notes = [], []
        for d in DIRECTIONS:
            o = r.outcome(d)
            cells.append(o.status + marks[verdict(r.name, d, o, known)])
            if o.status == "fail" or (o.status == "fallback" and o.fallbacks):
                notes.append(f"{d[0]}: {o.reason}" if o.status == "fail"
                             else f"{d[0]}: CPU fallback: {', '.join(o.fallbacks)}")
            elif o.status == "skip" and d == "forward":
                notes.append(f"f: {o.reason}")
        lines.append(f"| `{r.name}` | {cells[0]} | {cells[1]} | {_cell('; '.join(notes))} |")
    return "\n".join(lines) + "\n"
