"""Lowering: ATen ops to JAX, in one table (see registry)."""
