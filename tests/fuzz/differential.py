"""One fuzz program run on the CPU and on pjrt in each eager mode (and compiled), its
differences sorted into known (fuzz/known_failures.py) and new."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import known_failures, observe
from .programs import Program

EAGER_MODES = ("strict", "fused", "debug")


@dataclass
class Verdict:
    new: dict[str, list[str]] = field(default_factory=dict)  # mode -> unexplained differences
    known: dict[str, str] = field(default_factory=dict)  # mode -> the known failure's name

    def report(self, program: Program) -> str:
        parts = []
        for mode, diffs in self.new.items():
            parts.append(f"--- pjrt {mode} differs from the CPU:\n" + "\n".join(diffs))
            parts.append(f"--- to reproduce:\n{program.source(mode)}")
        return "\n".join(parts)


def compiles(program: Program, cpu: observe.Outcome) -> bool:
    """Whether the program is also run under torch.compile: it runs on the CPU without an
    error, and has no autograd statements (backward inside a compiled function breaks the
    graph, and is not what the eager comparison leaves uncovered)."""
    return not any(cpu.errors) and not program.autograd


PYTORCH_COMPILE = "torch.compile(backend='aot_eager') on the CPU differs from eager the same way"


def _as_pytorch_compiles(program: Program, cpu: observe.Outcome, diffs: list[str]) -> bool:
    """Whether PyTorch's own torch.compile (AOTAutograd, no backend compiler) differs from
    eager in the same ways: its semantics (outputs that do not keep their aliasing or
    identity, version counters) or its bugs, not the backend's."""
    ref = observe.run_compiled(program, "cpu", "aot_eager")
    theirs = observe.differences(cpu, ref, program.all_lines, observe.COMPILED_FIELDS)
    return set(diffs) <= {d.replace("'aot_eager'", "'pjrt'") for d in theirs}


def check(program: Program, modes: tuple[str, ...] = EAGER_MODES) -> Verdict:
    """Run `program` on the CPU and in each of `modes` ("compile": torch.compile)."""
    cpu = observe.run(program)
    verdict = Verdict()
    for mode in modes:
        if mode == "compile":
            if not compiles(program, cpu):
                continue
            dev = observe.run_compiled(program)
            fields = observe.COMPILED_FIELDS
        else:
            dev = observe.run(program, "pjrt", mode, cpu)
            fields = observe.FIELDS
        diffs = observe.differences(cpu, dev, program.all_lines, fields)
        if not diffs:
            continue
        if mode == "compile" and _as_pytorch_compiles(program, cpu, diffs):
            verdict.known[mode] = PYTORCH_COMPILE
            continue
        known = known_failures.explain(program, mode, diffs)
        if known is None:
            verdict.new[mode] = diffs
        else:
            verdict.known[mode] = known
    return verdict
