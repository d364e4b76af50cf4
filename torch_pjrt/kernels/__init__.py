"""torch_pjrt.kernels: JAX functions and Pallas kernels as PyTorch operators.

- `register_jax(op, fn)`: `fn` as the pjrt kernel of an operator defined with
  `torch.library.custom_op` or `torch.library.define` (register.py);
- `jax_op(qualname, schema)`: an operator defined by a JAX function alone (jax_op.py);
- Pallas kernels inside either run natively on TPU and GPU, interpreted on XLA:CPU
  (`pallas.native()` says which);
- `examples`: shipped Pallas kernels (RMSNorm, softmax cross-entropy, flash attention),
  whose operators register when it is first imported (`torch_pjrt.kernels.examples`);
  at start only where the platform compiles Pallas natively, where SDPA may select the
  flash kernels: elsewhere their registration, Pallas's import included, would cost every
  process about 0.15 s of its start for kernels it runs interpreted only when called;
- `lstm`: nn.LSTM on pjrt as one operator scanning the sequence (aten::lstm.input).
"""

import importlib

from . import (
    lstm,  # noqa: F401 - nn.LSTM as one scanned operator on pjrt
    pallas,
)
from .jax_op import jax_op
from .register import register_jax


def start() -> None:
    """Register the kernels the device's ops need at start: nn.LSTM's scan (imported
    above), and the shipped Pallas kernels where SDPA may select them."""
    if pallas.native():
        importlib.import_module(".examples", __name__)


def __getattr__(name: str):
    """`torch_pjrt.kernels.examples` imported (its operators registered) when first used."""
    if name == "examples":
        return importlib.import_module(".examples", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["examples", "jax_op", "pallas", "register_jax"]
