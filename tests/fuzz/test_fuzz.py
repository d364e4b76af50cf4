"""Differential fuzzing: random programs over views, in-place ops through views, out=,
aliasing, dtype promotion and autograd do on pjrt what they do on the CPU, in strict, fused
and debug eager modes and under torch.compile: the same errors at the same lines, and at the
end the same values, dtypes, shapes, strides, storage offsets, aliasing, version counters
and gradients (fuzz/observe.py says what is compared, fuzz/statements.py what is drawn).

A fixed seed (derandomize); TORCH_PJRT_FUZZ_EXAMPLES sets how many programs. A failure
prints the shrunk program as a script to paste. Known differences, with their reasons:
fuzz/known_failures.py.
"""

from hypothesis import HealthCheck, Phase, given, settings

from fuzz.differential import EAGER_MODES, check
from fuzz.programs import programs
from torch_pjrt import _env

EXAMPLES = int(_env.get("TORCH_PJRT_FUZZ_EXAMPLES"))

_SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                 suppress_health_check=list(HealthCheck),
                 phases=(Phase.explicit, Phase.generate, Phase.shrink))


@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(program=programs())
def test_eager_modes_match_cpu(program):
    verdict = check(program, EAGER_MODES)
    assert not verdict.new, verdict.report(program)


@settings(max_examples=max(EXAMPLES // 10, 1), **_SETTINGS)
@given(program=programs(max_lines=5))
def test_compiled_matches_cpu(program):
    verdict = check(program, ("compile",))
    assert not verdict.new, verdict.report(program)
