"""Lowering families, one module per family of ATen ops."""

from . import copying, elementwise  # noqa: F401
