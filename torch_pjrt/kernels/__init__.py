"""torch_pjrt.kernels: JAX functions and Pallas kernels as PyTorch operators.

- `register_jax(op, fn)`: `fn` as the pjrt kernel of an operator defined with
  `torch.library.custom_op` or `torch.library.define` (register.py);
- `jax_op(qualname, schema)`: an operator defined by a JAX function alone (jax_op.py);
- Pallas kernels inside either run natively on TPU and GPU, interpreted on XLA:CPU
  (`pallas.native()` says which);
- `examples`: shipped Pallas kernels (RMSNorm, softmax cross-entropy, flash attention);
- `lstm`: nn.LSTM on pjrt as one operator scanning the sequence (aten::lstm.input).
"""

from . import (  # examples: registers the shipped kernels' operators
    examples,
    lstm,  # noqa: F401 - nn.LSTM as one scanned operator on pjrt
    pallas,
)
from .jax_op import jax_op
from .register import register_jax

__all__ = ["examples", "jax_op", "pallas", "register_jax"]
