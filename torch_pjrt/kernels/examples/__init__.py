"""Shipped Pallas kernels as PyTorch operators (namespace `pjrt_kernels`), each with a
PyTorch body for CPU tensors, a fake, an autograd formula whose backward is a Pallas kernel
too, and `register_jax` for pjrt:

- `rms_norm(x, weight, eps)`: fused RMSNorm, forward and backward (norm.py);
- `softmax_cross_entropy(logits, target)`: per-row loss over a large vocabulary in vocabulary
  blocks with an online log-sum-exp, never holding the probabilities (cross_entropy.py);
- `flash_attention(q, k, v, causal, scale)`: blocked (causal) flash attention, forward and
  backward; `F.scaled_dot_product_attention` selects it where the platform compiles Pallas
  natively (flash.py).
"""

from .cross_entropy import softmax_cross_entropy
from .flash import flash_attention
from .norm import rms_norm

__all__ = ["flash_attention", "rms_norm", "softmax_cross_entropy"]
