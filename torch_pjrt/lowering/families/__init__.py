"""Lowering families, one module per family of ATen ops."""

from . import (  # noqa: F401
    copying,
    dynamic,
    elementwise,
    factories,
    foreach,
    indexing,
    linalg,
    nn,
    reductions,
    shape,
)
