"""A library's model trained on the CPU and on pjrt side by side: what differs, by how much,
which ops fell back to the CPU. The ecosystem tests assert on it; tools/ecosystem_sweep.py
reports it per model."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import torch_pjrt

MODES = ("fused", "strict", "compile")


@dataclass
class Gap:
    """How far one pjrt quantity is from the CPU's: the largest difference, and that
    difference over the largest magnitude of the CPU's values of its group (all the
    gradients of a step, all the parameters), which the tolerance bounds. A group's scale
    and not each tensor's own: a gradient that is zero but for rounding (a key
    projection's bias, which softmax ignores) has no scale of its own."""
    what: str
    max_abs: float
    relative: float


@dataclass
class Comparison:
    """Every quantity compared in one case, the tolerance, and the CPU fallbacks seen."""
    tolerance: float
    gaps: list[Gap] = field(default_factory=list)
    fallbacks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, what: str, actual: Any, expected: Any) -> None:
        """Compare pjrt's `actual` with the CPU's `expected`: a tensor or number, or a list
        or dict of them (one group, one scale); shapes and dtypes must agree exactly."""
        pairs = list(_flatten(what, actual, expected))
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
                self.gaps.append(Gap(name, wrong, wrong))
                continue
            diff = (a.double().nan_to_num() - e.double().nan_to_num()).abs()
            max_abs = float(diff.max()) if diff.numel() else 0.0
            self.gaps.append(Gap(name, max_abs, max_abs / scale if scale > 0 else max_abs))

    @property
    def worst(self) -> Gap:
        return max(self.gaps, key=lambda g: g.relative, default=Gap("nothing", 0.0, 0.0))

    @property
    def ok(self) -> bool:
        return self.worst.relative <= self.tolerance

    def check(self) -> None:
        """Raise AssertionError naming every quantity beyond the tolerance."""
        beyond = [g for g in self.gaps if g.relative > self.tolerance]
        assert not beyond, (f"{len(beyond)} of {len(self.gaps)} quantities differ from the "
                            f"CPU beyond {self.tolerance:g} (relative to their group's largest "
                            "value): " + "; ".join(
                                f"{g.what}: {g.max_abs:.3g} ({g.relative:.3g})"
                                for g in sorted(beyond, key=lambda g: -g.relative)[:8]))


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
    """The first step's output, loss and gradients, each step's loss, and the parameters
    after `steps` optimizer steps. `loss_of(output, batch)`; `forward(batch)` defaults to
    the model called on the batch (a tensor, a tuple of arguments or keyword arguments)."""
    forward = forward or _caller(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params)
    first, losses = None, []
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
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    return {**first, "losses": losses, "params": state}


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
                     tolerance: float = 1e-4) -> Comparison:
    """`model` (on the CPU) trained `steps` steps on the CPU and, from the same weights, on
    pjrt in `mode` ("fused", "strict", or "compile": torch.compile(backend="pjrt") over
    fused eager): the first step's outputs and gradients, every loss and the final
    parameters compared."""
    optimizer = optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    cpu, dev = pair(model)
    expected = train(cpu, batch, loss_of, steps, optimizer)
    with compared(tolerance) as result, eager_mode(mode):
        forward = None
        if mode == "compile":
            torch._dynamo.reset()
            forward = _caller(torch.compile(dev, backend="pjrt"))
        actual = train(dev, to(batch, "pjrt"), loss_of, steps, optimizer, forward)
        result.add("output", actual["output"], expected["output"])
        result.add("grad", actual["grads"], expected["grads"])
        result.add("loss", actual["losses"], expected["losses"])
        result.add("param", actual["params"], expected["params"])
    return result
