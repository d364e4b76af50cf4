"""Differential fuzzing: random small programs run on CPU PyTorch and on pjrt, compared."""
