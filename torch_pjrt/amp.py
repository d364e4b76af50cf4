"""Autocast's per-op cast policy on the pjrt device, as data (the casts themselves are
runtime/native/autocast.cpp's, from ATen's lists; tests/amp check that the two agree)."""

from __future__ import annotations

import torch

__all__ = ["POLICIES", "POLICY", "CUDA_ONLY", "registered", "markdown_table"]

# What each policy does to a call's floating-point pjrt arguments (float64 ones are left
# alone by every policy, as on CUDA), and so to its result's dtype.
POLICIES: dict[str, str] = {
    "lower_precision_fp": "cast to the autocast dtype (bfloat16 or float16)",
    "fp32": "cast to float32",
    "fp32_set_opt_dtype": "run in float32 (dtype=float32 passed), unless a dtype is given",
    "fp32_append_dtype": "run in float32 (the overload that takes a dtype, given float32)",
    "promote": "cast all to the widest floating dtype among them",
    "refused": "raises RuntimeError inside autocast",
}


def _ops(policy: str, names: str) -> dict[str, str]:
    return {f"aten::{name}": policy for name in names.split()}


# CUDA autocast's policy in PyTorch 2.13: the AT_FORALL_* lists of ATen's autocast_mode.h
# plus binary_cross_entropy, which CUDA refuses. Keys are "aten::op" or "aten::op.overload".
POLICY: dict[str, str] = {
    **_ops("lower_precision_fp", """
        _convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr
        matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul
        linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell
        rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention
        scaled_dot_product_attention"""),
    **_ops("fp32", """
        acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
        pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm
        rms_norm group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity
        poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div
        l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
        soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits
        dist pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d
        upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d
        _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa
        upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa"""),
    **_ops("fp32_set_opt_dtype", """
        prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
        linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList"""),
    **_ops("fp32_append_dtype", "norm.Scalar norm.ScalarOpt_dim"),
    **_ops("promote", """
        addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot
        scatter_add"""),
    **_ops("refused", "binary_cross_entropy"),
}

# CUDA has autocast kernels for these too, outside ATen's lists; pjrt's fall through. Not
# every torch has each: the CPU build of torch has no _cudnn_rnn kernel, torch 2.13 no
# linalg_matrix_sqrth.
CUDA_ONLY: dict[str, str] = {
    "aten::cudnn_convolution": "cuDNN's kernel (lower_precision_fp on CUDA)",
    "aten::cudnn_convolution_transpose": "cuDNN's kernel (lower_precision_fp on CUDA)",
    "aten::_cudnn_rnn": "cuDNN's RNN kernel (lower_precision_fp on CUDA; CUDA builds only)",
    "aten::linalg_matrix_sqrth": (
        "torch 2.14 on: no cast on CUDA either (on fake CUDA tensors float32 stays float32 "
        "and the op refuses bfloat16 and float16, as without autocast)"),
}


def registered(dispatch_key: str = "AutocastPrivateUse1") -> set[str]:
    """The aten ops with a kernel of their own at `dispatch_key` (the rest fall through)."""
    return {name for name in torch._C._dispatch_get_registrations_for_dispatch_key(dispatch_key)
            if name.startswith("aten::")}


def markdown_table() -> str:
    """POLICY as docs/amp.md's table: one row per policy, its ops."""
    rows = ["| policy | what it does | ops |", "| --- | --- | --- |"]
    for policy, meaning in POLICIES.items():
        ops = sorted(name.removeprefix("aten::") for name, p in POLICY.items() if p == policy)
        rows.append(f"| `{policy}` ({len(ops)}) | {meaning} | {', '.join(ops)} |")
    return "\n".join(rows)
