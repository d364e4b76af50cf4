"""The hypothesis strategy of fuzz programs: inputs, then statements, as Python source that a
person can paste (a failing program shrinks to a few short lines)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hypothesis import strategies as st

from . import statements
from .statements import DTYPES, VALUES, Env, value_kind

_DEFINES = re.compile(r"^(v\d+) = ")


@dataclass(frozen=True)
class Program:
    """Lines creating the inputs (`x0`, `x1`, ...) on `device`, then the statements."""

    inputs: tuple[str, ...]
    lines: tuple[str, ...]

    @property
    def all_lines(self) -> tuple[str, ...]:
        return self.inputs + self.lines

    @property
    def autograd(self) -> bool:
        return any(k in line for line in self.lines for k in statements.AUTOGRAD_LINES)

    @property
    def input_names(self) -> list[str]:
        return [line.split(" ", 1)[0] for line in self.inputs]

    def function(self) -> str:
        """The statements as a function `fuzz_program(x0, ...)` returning every variable."""
        names = self.input_names + [m.group(1) for line in self.lines
                                    if (m := _DEFINES.match(line))]
        body = "\n".join(f"    {line}" for line in self.lines)
        return (f"def fuzz_program({', '.join(self.input_names)}):\n{body}\n"
                f"    return {{{', '.join(f'{n!r}: {n}' for n in names)}}}\n")

    def source(self, mode: str | None = None, device: str = "pjrt") -> str:
        """The program as a script to paste: eager `mode`, or "compile" (the statements as
        one function compiled with torch.compile(backend="pjrt"))."""
        head = ["import torch"]
        if device == "pjrt":
            head.append("import torch_pjrt")
            if mode not in (None, "compile"):
                head.append(f"torch_pjrt.set_eager_mode({mode!r})")
        head.append(f"device = {device!r}")
        if mode != "compile":
            return "\n".join(head + list(self.all_lines))
        call = f"out = fuzz_program({', '.join(self.input_names)})"
        return "\n".join(head + list(self.inputs) + ['@torch.compile(backend="pjrt")',
                                                      self.function(), call])

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return "\n" + "\n".join(self.all_lines) + "\n"


def _nested(values: list, shape: tuple[int, ...]) -> str:
    if not shape:
        return repr(values[0])
    step = len(values) // shape[0]
    return "[" + ", ".join(_nested(values[i * step:(i + 1) * step], shape[1:])
                           for i in range(shape[0])) + "]"


@st.composite
def _input(draw, name: str) -> tuple[str, bool]:
    """A line making one input tensor from literal values; (line, requires grad)."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(1, 3 if rank == 3 else 4)) for _ in range(rank))
    if rank and draw(st.integers(0, 19)) == 0:
        shape = (0,) + shape[1:]
    grad = value_kind(dtype) in ("float", "complex") and draw(st.integers(0, 2)) == 0
    tail = f"dtype=torch.{dtype}, device=device" + (", requires_grad=True" if grad else "")
    n = math.prod(shape)
    if n == 0:
        return f"{name} = torch.zeros({shape}, {tail})", grad
    values = [draw(st.sampled_from(VALUES[value_kind(dtype)])) for _ in range(n)]
    return f"{name} = torch.tensor({_nested(values, shape)}, {tail})", grad


def _dropped(draw) -> bool:
    """Whether to leave out the next input or statement: rarely when generating, and what
    shrinking turns to (0), so that a failing program loses the lines it does not need."""
    return draw(st.integers(0, 15)) == 0


@st.composite
def programs(draw, max_inputs: int = 3, max_lines: int = 8) -> Program:
    """A program of 1 to `max_inputs` inputs and 1 to `max_lines` statements, generated
    against its own CPU run (each statement sees the tensors earlier ones made)."""
    env = Env()
    inputs = []
    for i in range(draw(st.integers(1, max_inputs))):
        if i and _dropped(draw):
            continue
        line, grad = draw(_input(f"x{i}"))
        env.run(line, f"x{i}")
        env.grad |= grad
        inputs.append(line)
    lines = []
    for _ in range(draw(st.integers(1, max_lines))):
        if _dropped(draw):
            continue
        family = draw(st.sampled_from(statements.FAMILIES))
        made = draw(st.sampled_from(family))(draw, env)
        if made is None:
            continue
        line, defines = made
        env.run(line, defines)
        lines.append(line)
    return Program(tuple(inputs), tuple(lines))
