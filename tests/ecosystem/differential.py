"""A library's model trained on the CPU and on pjrt side by side: what differs, by how much,
which ops fell back to the CPU. The ecosystem tests assert on it; tools/ecosystem_sweep.py
reports it per model.

A training run is judged on accuracy, not on matching the CPU's rounding: pjrt's float32
run must be about as close to a float64 run of the same model as the CPU's float32 run is
(tests/tolerance.py's assert_as_accurate). Where it is not, the same training in float64 on
both devices tells a wrong lowering (it differs in float64 too) from float32 rounding the
model amplifies (a BatchNorm over a handful of values per channel puts a ReLU's input
within rounding of zero, and the side that rounds it below zero drops that gradient)."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from tolerance import accuracy_excess, adamw_step_sensitivity

import torch_pjrt

MODES = ("fused", "strict", "compile")
# How far the float64 runs of a model may differ, relative to their group's largest value:
# float64 rounds 2**29 times finer than float32, so a model that amplifies float32's
# rounding to 10% leaves float64's below 1e-9; a wrong lowering is off by far more.
FLOAT64_TOLERANCE = 1e-8


@dataclass
class Gap:
    """How far one pjrt quantity is from the CPU's: the largest difference, that difference
    over the largest magnitude of the CPU's values of its group (all the gradients of a
    step, all the parameters; a gradient that is zero but for rounding has no scale of its
    own), and `excess`: the measured error over the error allowed (above 1 fails). Allowed:
    `tolerance` times the group's scale, or, against a float64 reference, what
    assert_as_accurate allows (8 times the CPU's own error in that tensor)."""
    what: str
    max_abs: float
    relative: float
    excess: float = 0.0


@dataclass
class Comparison:
    """Every quantity compared in one case, the tolerance, and the CPU fallbacks seen;
    `float64`: the same case run in float64 on both devices, where float32 was not as
    accurate as the CPU's."""
    tolerance: float
    gaps: list[Gap] = field(default_factory=list)
    fallbacks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    float64: Comparison | None = None

    def add(self, what: str, actual: Any, expected: Any, reference: Any = None,
            sensitivity: dict | None = None) -> None:
        """Compare pjrt's `actual` with the CPU's `expected`: a tensor or number, or a list
        or dict of them (one group, one scale); shapes and dtypes must agree exactly. With
        `reference` (the same tree from a float64 run), each tensor is held to be as
        accurate as the CPU's; `sensitivity` (by the tree's names) as assert_as_accurate's."""
        pairs = list(_flatten(what, actual, expected))
        refs = dict((n, r) for n, _, r in _flatten(what, reference, reference)) \
            if reference is not None else {}
        floats = [(n, a.detach().cpu(), e.detach()) for n, a, e in pairs]
        for name, a, e in floats:
            assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
            assert a.dtype == e.dtype, f"{name}: dtype {a.dtype} != {e.dtype}"
            assert torch.equal(a.isnan(), e.isnan()), f"{name}: NaNs at other places"
        scale = max((float(e.double().nan_to_num().abs().max()) for _, _, e in floats
                     if e.is_floating_point() and e.numel()), default=0.0)
        for name, a, e in floats:
            if not e.is_floating_point():
                wrong = float((a != e).sum())
                self.gaps.append(Gap(name, wrong, wrong, float("inf") if wrong else 0.0))
                continue
            diff = (a.double().nan_to_num() - e.double().nan_to_num()).abs()
            max_abs = float(diff.max()) if diff.numel() else 0.0
            relative = max_abs / scale if scale > 0 else max_abs
            if name in refs:
                excess = accuracy_excess(a, e, refs[name], sensitivity=(sensitivity or {}).get(
                    name.split("[", 1)[-1].rstrip("]")))
            else:
                excess = relative / self.tolerance
            self.gaps.append(Gap(name, max_abs, relative, excess))

    @property
    def worst(self) -> Gap:
        return max(self.gaps, key=lambda g: g.excess, default=Gap("nothing", 0.0, 0.0))

    @property
    def accurate(self) -> bool:
        """Every quantity within what it is allowed."""
        return self.worst.excess <= 1

    @property
    def rounding(self) -> bool:
        """Not accurate in float32, but the outputs are, and the float64 runs agree: the
        lowerings compute the CPU's math, and the model amplifies float32's rounding."""
        return (not self.accurate and self.float64 is not None and self.float64.accurate
                and all(g.excess <= 1 for g in self.gaps if g.what.startswith("output")))

    @property
    def ok(self) -> bool:
        return self.accurate or self.rounding

    @property
    def verdict(self) -> str:
        """"pass", "rounding" (see `rounding`) or "differs"."""
        return "pass" if self.accurate else "rounding" if self.rounding else "differs"

    def check(self) -> None:
        """Raise AssertionError naming every quantity beyond what it is allowed (in float32
        when the float64 runs do not show rounding, else in float64)."""
        if self.rounding:
            return
        bad = self.float64 if self.float64 is not None and not self.float64.accurate else self
        beyond = [g for g in bad.gaps if g.excess > 1]
        assert not beyond, (
            f"{len(beyond)} of {len(bad.gaps)} quantities differ from the CPU "
            f"{'in float64 ' if bad is not self else ''}beyond what is allowed (the "
            "error over the allowed error in parentheses; largest difference, relative to "
            "the group's largest value): " + "; ".join(
                f"{g.what}: {g.max_abs:.3g}, {g.relative:.3g} ({g.excess:.3g}x)"
                for g in sorted(beyond, key=lambda g: -g.excess)[:8]))


def _flatten(what: str, actual: Any, expected: Any):
    """(name, pjrt tensor, CPU tensor) of every leaf of two matching trees."""
    if isinstance(expected, dict):
        assert set(actual) == set(expected), f"{what}: keys {set(actual) ^ set(expected)}"
        for k in expected:
            yield from _flatten(f"{what}[{k}]", actual[k], expected[k])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _flatten(f"{what}[{i}]", a, e)
    else:
        yield what, torch.as_tensor(actual), torch.as_tensor(expected)


def _floating(tree: Any, dtype: torch.dtype) -> Any:
    """`tree` with its floating-point tensors in `dtype` (token ids and labels kept)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, dict):
        return {k: _floating(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_floating(v, dtype) for v in tree)
    return tree


@contextlib.contextmanager
def compared(tolerance: float) -> Iterator[Comparison]:
    """A Comparison that also counts the CPU fallbacks and time of the block."""
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    start = time.perf_counter()
    result = Comparison(tolerance)
    yield result
    after = torch_pjrt.metrics()["cpu_fallbacks"]
    result.fallbacks = {op: n - before.get(op, 0) for op, n in after.items()
                        if n > before.get(op, 0)}
    result.seconds = time.perf_counter() - start


def eager_mode(mode: str):
    """The eager mode a case runs pjrt in (torch.compile runs over fused eager)."""
    return torch_pjrt.set_eager_mode("fused" if mode == "compile" else mode)


def to(tree: Any, device: str) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to(v, device) for v in tree)
    return tree


def pair(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model on the CPU and a copy of it on pjrt, both without random drops."""
    model = without_dropout(model)
    return model, copy.deepcopy(model).to("pjrt")


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every dropout, drop-path and stochastic-depth probability at 0: each
    device draws its own random masks (the CPU's generator and pjrt's differ), so a model
    that drops in training mode cannot be compared (timm's Swin drops paths by default)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for attribute in ("drop_prob", "p"):  # timm's DropPath, torchvision's StochasticDepth
            if type(module).__name__ in ("DropPath", "StochasticDepth") \
                    and hasattr(module, attribute):
                setattr(module, attribute, 0.0)
    return model


def train(model: torch.nn.Module, batch: Any, loss_of: Callable[[Any, Any], torch.Tensor],
          steps: int, optimizer: Callable, forward: Callable | None = None) -> dict:
    """The first step's output, loss and gradients, each step's loss, the parameters after
    `steps` optimizer steps and, for Adam and AdamW, how much the steps amplified each
    parameter's gradient errors (tolerance.adamw_step_sensitivity, summed over the steps).
    `loss_of(output, batch)`; `forward(batch)` defaults to the model called on the batch (a
    tensor, a tuple of arguments or keyword arguments)."""
    forward = forward or _caller(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params)
    names = {id(p): n for n, p in model.named_parameters()}
    first, losses, sensitivity = None, [], {}
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        out = forward(batch)
        loss = loss_of(out, batch)
        loss.backward()
        if first is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                     if p.grad is not None}
            first = {"output": _detached(out), "grads": grads}
        opt.step()
        losses.append(loss.detach())
        if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
            for p, amplified in adamw_step_sensitivity(opt).items():
                n = names[id(p)]
                sensitivity[n] = sensitivity.get(n, 0) + amplified
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    return {**first, "losses": torch.stack(losses), "params": state,
            "sensitivity": sensitivity}


def _caller(model):
    def forward(batch):
        if isinstance(batch, dict):
            return model(**batch)
        if isinstance(batch, (list, tuple)):
            return model(*batch)
        return model(batch)
    return forward


def _detached(out: Any) -> Any:
    """The tensors of a model's output (ModelOutput and BaseOutput are dicts), detached;
    what is not a tensor (a KV cache object) is left out."""
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, dict):
        return {k: _detached(v) for k, v in out.items() if _holds_tensors(v)}
    if isinstance(out, (list, tuple)):
        return [_detached(v) for v in out if _holds_tensors(v)]
    return out


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


def compare_training(model: torch.nn.Module, batch: Any, loss_of: Callable, *, mode: str,
                     steps: int = 3, optimizer: Callable | None = None,
                     tolerance: float = FLOAT64_TOLERANCE) -> Comparison:
    """`model` (on the CPU, in float32) trained `steps` steps on the CPU, in float64 on the
    CPU (the reference) and, from the same weights, on pjrt in `mode` ("fused", "strict", or
    "compile": torch.compile(backend="pjrt") over fused eager): the first step's outputs
    and gradients, every loss and the final parameters of pjrt's run held to be as accurate
    as the CPU's. Where they are not, both devices train in float64 too, compared within
    `tolerance` of each group's largest value (the result's `float64`)."""
    optimizer = optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    cpu, dev = pair(model)
    start = copy.deepcopy(cpu)
    expected = train(cpu, batch, loss_of, steps, optimizer)
    reference = train(copy.deepcopy(start).double(), _floating(batch, torch.float64),
                      loss_of, steps, optimizer)
    with compared(tolerance) as result, eager_mode(mode):
        actual = _train_on_pjrt(dev, batch, loss_of, steps, optimizer, mode)
        _add_training(result, actual, expected, reference)
        if not result.accurate:
            result.float64 = Comparison(tolerance)
            wide = _train_on_pjrt(copy.deepcopy(start).double().to("pjrt"),
                                  _floating(batch, torch.float64), loss_of, steps,
                                  optimizer, mode)
            _add_training(result.float64, wide, reference)
    return result


def _train_on_pjrt(model, batch, loss_of, steps, optimizer, mode) -> dict:
    forward = None
    if mode == "compile":
        torch._dynamo.reset()
        forward = _caller(torch.compile(model, backend="pjrt"))
    return train(model, to(batch, "pjrt"), loss_of, steps, optimizer, forward)


def _add_training(result: Comparison, actual: dict, expected: dict,
                  reference: dict | None = None) -> None:
    """The quantities of two train() runs into `result` (against `reference` if given)."""
    ref = reference or {}
    for what, key in (("output", "output"), ("grad", "grads"), ("loss", "losses"),
                      ("param", "params")):
        result.add(what, actual[key], expected[key], ref.get(key),
                   sensitivity=ref.get("sensitivity") if key == "params" else None)


def case_params(cases: dict, ci: set) -> list:
    """The cases as pytest parameters: those in `ci` run in CI, the rest are slow (flagged)."""
    return [pytest.param(c, marks=[] if c in ci else [pytest.mark.slow]) for c in cases]


def check_case(run: Callable[[], Comparison]) -> None:
    """Run a case: its results within the bounds, and no op on the CPU."""
    result = run()
    result.check()
    assert not result.fallbacks, f"ops ran on the CPU: {result.fallbacks}"
