"""Lowering families, one module per family of ATen ops."""

from . import (  # noqa: F401
    attention,
    conv,
    copying,
    dynamic,
    elementwise,
    factories,
    foreach,
    indexing,
    linalg,
    losses,
    nn,
    normalization,
    pooling,
    reductions,
    shape,
    sorting,
    upsample,
    views,
)
