"""One call per entry of torch_pjrt.amp.POLICY (and a few ops autocast lets through), and
the references the autocast tests compare pjrt with: CUDA autocast on fake CUDA tensors,
and the CPU running the cast the policy prescribes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten


@dataclass(frozen=True)
class Sample:
    """fn(*args): args made on the CPU in float32 (integer ones for indices and targets)."""

    fn: Callable
    make: Callable[[], tuple]


def _r(*shape, lo=-1.0, hi=1.0):
    return torch.empty(shape).uniform_(lo, hi)


def _pos(*shape):
    return _r(*shape, lo=0.5, hi=2.0)


def _long(high, *shape):
    return torch.randint(0, high, shape)


def _unary(op, make=lambda: (_r(3, 4),)):
    return Sample(op, make)


def _cell(op, gates):
    """An RNN cell: (input, hidden, w_ih, w_hh, b_ih, b_hh) with `gates` hidden blocks."""
    return Sample(op, lambda: (_r(2, 3), _r(2, 4), _r(gates * 4, 3), _r(gates * 4, 4),
                               _r(gates * 4), _r(gates * 4)))


SAMPLES: dict[str, Sample] = {
    # ------------------------------------------------------------ lower_precision_fp
    "aten::_convolution.deprecated": Sample(
        lambda x, w, b: aten._convolution.deprecated(x, w, b, [1, 1], [1, 1], [1, 1], False,
                                                     [0, 0], 1, False, False, True),
        lambda: (_r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3))),
    "aten::_convolution": Sample(
        lambda x, w, b: aten._convolution(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                          False, False, True, True),
        lambda: (_r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3))),
    "aten::conv1d": Sample(lambda x, w, b: aten.conv1d(x, w, b),
                           lambda: (_r(2, 2, 7), _r(3, 2, 3), _r(3))),
    "aten::conv2d": Sample(lambda x, w, b: aten.conv2d(x, w, b, [1, 1], [1, 1]),
                           lambda: (_r(2, 2, 5, 5), _r(3, 2, 3, 3), _r(3))),
    "aten::conv3d": Sample(lambda x, w: aten.conv3d(x, w),
                           lambda: (_r(1, 2, 4, 4, 4), _r(3, 2, 2, 2, 2))),
    "aten::conv_tbc": Sample(lambda x, w, b: aten.conv_tbc(x, w, b, 1),
                             lambda: (_r(6, 2, 3), _r(3, 3, 4), _r(4))),
    "aten::conv_transpose1d": Sample(lambda x, w: aten.conv_transpose1d(x, w),
                                     lambda: (_r(2, 3, 5), _r(3, 2, 3))),
    "aten::conv_transpose2d.input": Sample(
        lambda x, w, b: aten.conv_transpose2d.input(x, w, b, [2, 2]),
        lambda: (_r(1, 3, 4, 4), _r(3, 2, 3, 3), _r(2))),
    "aten::conv_transpose3d.input": Sample(lambda x, w: aten.conv_transpose3d.input(x, w),
                                           lambda: (_r(1, 2, 3, 3, 3), _r(2, 2, 2, 2, 2))),
    "aten::convolution": Sample(
        lambda x, w, b: aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        lambda: (_r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3))),
    "aten::prelu": Sample(aten.prelu, lambda: (_r(2, 3, 4), _pos(3) / 4)),
    "aten::addmm": Sample(aten.addmm, lambda: (_r(3, 5), _r(3, 4), _r(4, 5))),
    "aten::addmv": Sample(aten.addmv, lambda: (_r(3), _r(3, 4), _r(4))),
    "aten::addr": Sample(aten.addr, lambda: (_r(3, 4), _r(3), _r(4))),
    "aten::matmul": Sample(aten.matmul, lambda: (_r(2, 3, 4), _r(4, 5))),
    "aten::einsum": Sample(lambda a, b: aten.einsum("ij,jk->ik", [a, b]),
                           lambda: (_r(3, 4), _r(4, 5))),
    "aten::mm": Sample(aten.mm, lambda: (_r(3, 4), _r(4, 5))),
    "aten::mv": Sample(aten.mv, lambda: (_r(3, 4), _r(4))),
    "aten::linalg_vecdot": Sample(aten.linalg_vecdot, lambda: (_r(3, 4), _r(3, 4))),
    "aten::linear": Sample(aten.linear, lambda: (_r(2, 4), _r(5, 4), _r(5))),
    "aten::addbmm": Sample(aten.addbmm, lambda: (_r(3, 5), _r(2, 3, 4), _r(2, 4, 5))),
    "aten::baddbmm": Sample(aten.baddbmm, lambda: (_r(2, 3, 5), _r(2, 3, 4), _r(2, 4, 5))),
    "aten::bmm": Sample(aten.bmm, lambda: (_r(2, 3, 4), _r(2, 4, 5))),
    "aten::chain_matmul": Sample(lambda a, b, c: aten.chain_matmul([a, b, c]),
                                 lambda: (_r(3, 4), _r(4, 5), _r(5, 2))),
    "aten::linalg_multi_dot": Sample(lambda a, b, c: aten.linalg_multi_dot([a, b, c]),
                                     lambda: (_r(3, 4), _r(4, 5), _r(5, 2))),
    "aten::_thnn_fused_lstm_cell": Sample(
        lambda ig, hg, cx, bi, bh: aten._thnn_fused_lstm_cell(ig, hg, cx, bi, bh)[0],
        lambda: (_r(2, 16), _r(2, 16), _r(2, 4), _r(16), _r(16))),
    "aten::_thnn_fused_gru_cell": Sample(
        lambda ig, hg, hx, bi, bh: aten._thnn_fused_gru_cell(ig, hg, hx, bi, bh)[0],
        lambda: (_r(2, 12), _r(2, 12), _r(2, 4), _r(12), _r(12))),
    "aten::lstm_cell": Sample(
        lambda x, h, c, wi, wh, bi, bh: aten.lstm_cell(x, [h, c], wi, wh, bi, bh)[0],
        lambda: (_r(2, 3), _r(2, 4), _r(2, 4), _r(16, 3), _r(16, 4), _r(16), _r(16))),
    "aten::gru_cell": _cell(aten.gru_cell, 3),
    "aten::rnn_tanh_cell": _cell(aten.rnn_tanh_cell, 1),
    "aten::rnn_relu_cell": _cell(aten.rnn_relu_cell, 1),
    "aten::_scaled_dot_product_flash_attention": Sample(
        lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v)[0],
        lambda: (_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8))),
    "aten::scaled_dot_product_attention": Sample(
        aten.scaled_dot_product_attention,
        lambda: (_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8))),
    # ------------------------------------------------------------------------- fp32
    "aten::acos": _unary(aten.acos, lambda: (_r(3, 4, lo=-0.9, hi=0.9),)),
    "aten::asin": _unary(aten.asin, lambda: (_r(3, 4, lo=-0.9, hi=0.9),)),
    "aten::cosh": _unary(aten.cosh),
    "aten::erfinv": _unary(aten.erfinv, lambda: (_r(3, 4, lo=-0.9, hi=0.9),)),
    "aten::exp": _unary(aten.exp),
    "aten::expm1": _unary(aten.expm1),
    "aten::log": _unary(aten.log, lambda: (_pos(3, 4),)),
    "aten::log10": _unary(aten.log10, lambda: (_pos(3, 4),)),
    "aten::log2": _unary(aten.log2, lambda: (_pos(3, 4),)),
    "aten::log1p": _unary(aten.log1p, lambda: (_pos(3, 4),)),
    "aten::reciprocal": _unary(aten.reciprocal, lambda: (_pos(3, 4),)),
    "aten::rsqrt": _unary(aten.rsqrt, lambda: (_pos(3, 4),)),
    "aten::sinh": _unary(aten.sinh),
    "aten::tan": _unary(aten.tan),
    "aten::pow.Tensor_Scalar": _unary(lambda x: aten.pow.Tensor_Scalar(x, 3)),
    "aten::pow.Tensor_Tensor": Sample(aten.pow.Tensor_Tensor, lambda: (_pos(3, 4), _r(3, 4))),
    "aten::pow.Scalar": _unary(lambda x: aten.pow.Scalar(2.5, x)),
    "aten::softplus": _unary(aten.softplus),
    "aten::layer_norm": Sample(lambda x, w, b: aten.layer_norm(x, [4], w, b),
                               lambda: (_r(2, 3, 4), _r(4), _r(4))),
    "aten::native_layer_norm": Sample(
        lambda x, w, b: aten.native_layer_norm(x, [4], w, b, 1e-5)[0],
        lambda: (_r(2, 3, 4), _r(4), _r(4))),
    "aten::rms_norm": Sample(lambda x, w: aten.rms_norm(x, [4], w, 1e-6),
                             lambda: (_r(2, 3, 4), _r(4))),
    "aten::group_norm": Sample(lambda x, w, b: aten.group_norm(x, 2, w, b),
                               lambda: (_r(2, 4, 3), _r(4), _r(4))),
    "aten::frobenius_norm.dim": _unary(lambda x: aten.frobenius_norm.dim(x, [1])),
    "aten::nuclear_norm": _unary(aten.nuclear_norm),
    "aten::nuclear_norm.dim": _unary(lambda x: aten.nuclear_norm.dim(x, [0, 1])),
    "aten::cosine_similarity": Sample(aten.cosine_similarity, lambda: (_r(3, 4), _r(3, 4))),
    "aten::poisson_nll_loss": Sample(
        lambda x, t: aten.poisson_nll_loss(x, t, True, False, 1e-8, 1),
        lambda: (_r(3, 4), _pos(3, 4))),
    "aten::cosine_embedding_loss": Sample(
        lambda a, b, t: aten.cosine_embedding_loss(a, b, t),
        lambda: (_r(3, 4), _r(3, 4), torch.tensor([1.0, -1.0, 1.0]))),
    "aten::nll_loss": Sample(aten.nll_loss, lambda: (_r(3, 5), _long(5, 3))),
    "aten::nll_loss2d": Sample(aten.nll_loss2d, lambda: (_r(2, 5, 3, 3), _long(5, 2, 3, 3))),
    "aten::hinge_embedding_loss": Sample(
        aten.hinge_embedding_loss, lambda: (_r(3, 4), torch.tensor([1.0, -1.0]).repeat(6)[:12]
                                            .reshape(3, 4))),
    "aten::kl_div": Sample(aten.kl_div, lambda: (_r(3, 4), _pos(3, 4) / 4)),
    "aten::l1_loss": Sample(aten.l1_loss, lambda: (_r(3, 4), _r(3, 4))),
    "aten::smooth_l1_loss": Sample(aten.smooth_l1_loss, lambda: (_r(3, 4), _r(3, 4))),
    "aten::huber_loss": Sample(aten.huber_loss, lambda: (_r(3, 4), _r(3, 4))),
    "aten::mse_loss": Sample(aten.mse_loss, lambda: (_r(3, 4), _r(3, 4))),
    "aten::margin_ranking_loss": Sample(
        aten.margin_ranking_loss, lambda: (_r(5), _r(5), torch.tensor([1.0, -1, 1, -1, 1]))),
    "aten::multilabel_margin_loss": Sample(
        lambda x, t: aten.multilabel_margin_loss(x, t),
        lambda: (_r(2, 4), torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]]))),
    "aten::soft_margin_loss": Sample(
        aten.soft_margin_loss, lambda: (_r(3, 4), torch.tensor([1.0, -1.0]).repeat(6)
                                        .reshape(3, 4))),
    "aten::triplet_margin_loss": Sample(aten.triplet_margin_loss,
                                        lambda: (_r(3, 4), _r(3, 4), _r(3, 4))),
    "aten::multi_margin_loss": Sample(aten.multi_margin_loss, lambda: (_r(3, 5), _long(5, 3))),
    "aten::binary_cross_entropy_with_logits": Sample(
        aten.binary_cross_entropy_with_logits, lambda: (_r(3, 4) * 3, _pos(3, 4) / 2)),
    "aten::dist": Sample(aten.dist, lambda: (_r(3, 4), _r(3, 4))),
    "aten::pdist": _unary(aten.pdist, lambda: (_r(4, 3),)),
    "aten::cdist": Sample(aten.cdist, lambda: (_r(3, 4), _r(5, 4))),
    "aten::renorm": _unary(lambda x: aten.renorm(x, 2, 0, 1.0)),
    "aten::logsumexp": _unary(lambda x: aten.logsumexp(x, [1])),
    "aten::upsample_nearest1d": _unary(lambda x: aten.upsample_nearest1d(x, [8]),
                                       lambda: (_r(1, 2, 4),)),
    "aten::_upsample_nearest_exact1d": _unary(lambda x: aten._upsample_nearest_exact1d(x, [6]),
                                              lambda: (_r(1, 2, 4),)),
    "aten::upsample_nearest2d": _unary(lambda x: aten.upsample_nearest2d(x, [6, 6]),
                                       lambda: (_r(1, 2, 3, 3),)),
    "aten::_upsample_nearest_exact2d": _unary(
        lambda x: aten._upsample_nearest_exact2d(x, [5, 5]), lambda: (_r(1, 2, 3, 3),)),
    "aten::upsample_nearest3d": _unary(lambda x: aten.upsample_nearest3d(x, [4, 4, 4]),
                                       lambda: (_r(1, 1, 2, 2, 2),)),
    "aten::_upsample_nearest_exact3d": _unary(
        lambda x: aten._upsample_nearest_exact3d(x, [3, 3, 3]), lambda: (_r(1, 1, 2, 2, 2),)),
    "aten::upsample_linear1d": _unary(lambda x: aten.upsample_linear1d(x, [7], False),
                                      lambda: (_r(1, 2, 4),)),
    "aten::upsample_bilinear2d": _unary(lambda x: aten.upsample_bilinear2d(x, [5, 5], True),
                                        lambda: (_r(1, 2, 3, 3),)),
    "aten::_upsample_bilinear2d_aa": _unary(
        lambda x: aten._upsample_bilinear2d_aa(x, [3, 3], False), lambda: (_r(1, 2, 6, 6),)),
    "aten::upsample_trilinear3d": _unary(
        lambda x: aten.upsample_trilinear3d(x, [3, 3, 3], False), lambda: (_r(1, 1, 2, 2, 2),)),
    "aten::upsample_bicubic2d": _unary(lambda x: aten.upsample_bicubic2d(x, [5, 5], False),
                                       lambda: (_r(1, 2, 3, 3),)),
    "aten::_upsample_bicubic2d_aa": _unary(
        lambda x: aten._upsample_bicubic2d_aa(x, [3, 3], False), lambda: (_r(1, 2, 6, 6),)),
    # ------------------------------------------------------------ fp32_set_opt_dtype
    "aten::prod": _unary(aten.prod, lambda: (_pos(2, 3),)),
    "aten::prod.dim_int": _unary(lambda x: aten.prod.dim_int(x, 1), lambda: (_pos(2, 3),)),
    "aten::softmax.int": _unary(lambda x: aten.softmax.int(x, -1)),
    "aten::log_softmax.int": _unary(lambda x: aten.log_softmax.int(x, -1)),
    "aten::cumprod": _unary(lambda x: aten.cumprod(x, 1), lambda: (_pos(2, 3),)),
    "aten::cumsum": _unary(lambda x: aten.cumsum(x, 1)),
    "aten::linalg_vector_norm": _unary(aten.linalg_vector_norm),
    "aten::linalg_matrix_norm": _unary(lambda x: aten.linalg_matrix_norm(x, 1)),
    "aten::linalg_matrix_norm.str_ord": _unary(aten.linalg_matrix_norm.str_ord),
    "aten::sum": _unary(aten.sum),
    "aten::sum.dim_IntList": _unary(lambda x: aten.sum.dim_IntList(x, [0])),
    # ------------------------------------------------------------- fp32_append_dtype
    "aten::norm.Scalar": _unary(aten.norm.Scalar),
    "aten::norm.ScalarOpt_dim": _unary(lambda x: aten.norm.ScalarOpt_dim(x, 2, [1])),
    # ---------------------------------------------------------------------- promote
    "aten::addcdiv": Sample(aten.addcdiv, lambda: (_r(3, 4), _r(3, 4), _pos(3, 4))),
    "aten::addcmul": Sample(aten.addcmul, lambda: (_r(3, 4), _r(3, 4), _r(3, 4))),
    "aten::atan2": Sample(aten.atan2, lambda: (_r(3, 4), _r(3, 4))),
    "aten::bilinear": Sample(aten.bilinear, lambda: (_r(2, 3), _r(2, 4), _r(5, 3, 4), _r(5))),
    "aten::cross": Sample(lambda a, b: aten.cross(a, b, 1), lambda: (_r(2, 3), _r(2, 3))),
    "aten::dot": Sample(aten.dot, lambda: (_r(4), _r(4))),
    "aten::vdot": Sample(aten.vdot, lambda: (_r(4), _r(4))),
    "aten::grid_sampler": Sample(lambda x, g: aten.grid_sampler(x, g, 0, 0, False),
                                 lambda: (_r(1, 2, 4, 4), _r(1, 3, 3, 2))),
    "aten::index_put": Sample(lambda x, i, v: aten.index_put(x, [i], v),
                              lambda: (_r(5, 3), torch.tensor([0, 3]), _r(2, 3))),
    "aten::tensordot": Sample(lambda a, b: aten.tensordot(a, b, [1], [0]),
                              lambda: (_r(3, 4), _r(4, 5))),
    "aten::scatter_add": Sample(lambda x, i, s: aten.scatter_add(x, 0, i, s),
                                lambda: (_r(4, 3), _long(4, 2, 3), _r(2, 3))),
}

# Ops autocast lets through (no kernel of their own): they keep their inputs' dtypes, and
# mixed inputs promote by PyTorch's own rules.
FALLTHROUGH: dict[str, Sample] = {
    "aten::add.Tensor": Sample(aten.add.Tensor, lambda: (_r(3, 4), _r(3, 4))),
    "aten::relu": _unary(aten.relu),
    "aten::gelu": _unary(aten.gelu),
    "aten::cat": Sample(lambda a, b: aten.cat([a, b]), lambda: (_r(2, 3), _r(4, 3))),
    "aten::stack": Sample(lambda a, b: aten.stack([a, b]), lambda: (_r(2, 3), _r(2, 3))),
    "aten::mean": _unary(aten.mean),
    "aten::max": _unary(aten.max),
    "aten::index_select": Sample(lambda x, i: aten.index_select(x, 0, i),
                                 lambda: (_r(4, 3), torch.tensor([2, 0]))),
    "aten::embedding": Sample(lambda w, i: aten.embedding(w, i),
                              lambda: (_r(6, 3), torch.tensor([[1, 5], [0, 2]]))),
    "aten::native_batch_norm": Sample(
        lambda x, w, b: aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[0],
        lambda: (_r(4, 3, 2), _r(3), _r(3))),
}


def first_float(out) -> torch.Tensor:
    """The op's first floating-point result (what the dtype checks read)."""
    return next(t for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.is_floating_point())


def prepare(policy: str, args: tuple, dtype: torch.dtype, *, mixed: bool = True) -> tuple:
    """The sample's arguments as a policy's test wants them: float32 for lower_precision_fp
    (autocast casts them down), the low dtype for the float32 policies (cast up), for
    promote the first floating argument in the low dtype and the rest in float32 (mixed)
    or all in the low dtype; through-going ops get the low dtype and float32 mixed."""
    floats = [i for i, a in enumerate(args) if a.is_floating_point()]
    if policy == "lower_precision_fp":
        low = set()
    elif policy in ("promote", "fallthrough") and mixed:
        low = set(floats[:1])
    else:
        low = set(floats)
    return tuple(a.to(dtype) if i in low else a for i, a in enumerate(args))


def expected_dtype(policy: str, args: tuple, dtype: torch.dtype) -> torch.dtype:
    """The dtype CUDA autocast gives the sample's result, by the policy's rule."""
    if policy == "lower_precision_fp":
        return dtype
    if policy.startswith("fp32"):
        return torch.float32
    floats = {a.dtype for a in args if a.is_floating_point()}
    return torch.float32 if torch.float32 in floats else dtype


def reference_inputs(policy: str, args: tuple, dtype: torch.dtype) -> tuple:
    """The arguments the op sees after autocast's cast, made by hand."""
    to = expected_dtype(policy, args, dtype)
    if policy == "fallthrough":
        return args
    return tuple(a.to(to) if a.is_floating_point() else a for a in args)


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype):
    """CUDA autocast switched on directly: torch.autocast("cuda") turns itself off where
    CUDA is not built, but the AutocastCUDA kernels are in every libtorch, and run on fake
    CUDA tensors."""
    prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", prev[0])
        torch.set_autocast_dtype("cuda", prev[1])


def cuda_dtype(sample: Sample, args: tuple, dtype: torch.dtype) -> torch.dtype:
    """The result dtype CUDA autocast gives the call (fake CUDA tensors: no CUDA needed)."""
    with FakeTensorMode():
        fake = tree_map(lambda a: torch.empty(a.shape, dtype=a.dtype, device="cuda")
                        if isinstance(a, torch.Tensor) else a, args)
        with cuda_autocast(dtype):
            return first_float(sample.fn(*fake)).dtype
