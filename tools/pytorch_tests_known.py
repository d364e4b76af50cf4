"""Known failures of PyTorch's own tests on pjrt (tools/pytorch_tests.py), each with its reason.

KNOWN maps a test file to {pattern: (reason, run)}: the pattern is fnmatch's, over the test's
device-free id (`TestShapeOps.test_flip_float32`); run=False keeps the test from running at
all (a crash or a hang would cost the run its time), run=True runs it and reports its failure
apart from the new ones. A reason says why pjrt differs, never "not implemented yet".
"""

from __future__ import annotations

from fnmatch import fnmatchcase

KNOWN: dict[str, dict[str, tuple[str, bool]]] = {
    "test_shape_ops.py": {
        "TestShapeOps.test_flip_float32": (
            "flips quantized tensors (quantize_per_tensor): pjrt has no quantized tensors "
            "(XLA has no scale/zero-point type; quantized models run int8 with explicit "
            "scales)", True),
    },
}


def _entry(file: str, test: str) -> tuple[str, bool] | None:
    for pattern, entry in KNOWN.get(file, {}).items():
        if fnmatchcase(test, pattern):
            return entry
    return None


def reason(file: str, test: str) -> str:
    """The reason `test` of `file` is known to fail, or ''."""
    entry = _entry(file, test)
    return entry[0] if entry else ""


def skip_reason(file: str, test: str) -> str:
    """The reason `test` of `file` is not run at all, or ''."""
    entry = _entry(file, test)
    return entry[0] if entry and not entry[1] else ""
