"""Linear algebra: matrix products, and the factorizations and solvers behind torch.linalg.

Factorizations follow LAPACK's conventions as PyTorch exposes them: pivots are
1-based row swaps (int32), `info` is 0 or the 1-based index where the
factorization broke down, and an error raised by `check_errors=True` is a
device-side check (reported at the next synchronization).

PyTorch factors A^T instead of A for a real contiguous A in `_linalg_det` and
`_linalg_slogdet` (the returned LU and pivots are those of A^T; `_linalg_solve_ex`
factors A itself), and its backward formulas decide the same way from A's strides: these
lowerings take `contiguous=` (A's layout as PyTorch sees it) and decide as it does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax._src.lax.linalg import geqrf as _geqrf  # not re-exported by jax.lax.linalg
from jax.lax import linalg as lax_linalg

from ... import _compat
from ...storage import dtypes
from .. import checks
from ..registry import lower
from ._ops import aten, is_complex, is_int

_PRECISION = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}


def precision():
    """XLA dot precision from torch.get_float32_matmul_precision() (PyTorch: exact fp32)."""
    return _PRECISION[torch.get_float32_matmul_precision()]


# ------------------------------------------------------------------ products
def matmul(a, b):
    """a @ b in the operands' dtype: float16/bfloat16 accumulate in float32, integers
    in their own type (wrapping like PyTorch's CPU kernel)."""
    out = a.dtype
    if out == jnp.bool_:
        # bool matmul: any(a & b) along the contraction.
        return jnp.matmul(a.astype(jnp.int32), b.astype(jnp.int32)) != 0
    acc = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else None
    return jnp.matmul(a, b, precision=precision(), preferred_element_type=acc).astype(out)


@lower(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default, promote="default",
       products=True)
def mm(a, b):
    return matmul(a, b)


def _out_dtype_check(a, out_dtype) -> None:
    """The check of CUDA's out_dtype products (the only kernels PyTorch has for them): the
    result is the operands' dtype, or float32 for float16 and bfloat16 operands."""
    if out_dtype != a.dtype and not (out_dtype == jnp.float32 and
                                     a.dtype in (jnp.float16, jnp.bfloat16)):
        raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 "
                           f"inputs (got {dtypes.to_torch(a.dtype)} inputs and out_dtype "
                           f"{dtypes.to_torch(out_dtype)})")


# mm / bmm / addmm with out_dtype (torch 2.13's `aten::mm.dtype`...): products of float16 or
# bfloat16 operands accumulated and returned in float32. The CPU build has no kernel for them
# (CUDA has); baddbmm.dtype is left out: torch 2.13's meta function for it raises TypeError.
@lower(aten.mm.dtype, aten.bmm.dtype, products=True)
def mm_out_dtype(a, b, out_dtype, *, meta):
    out = meta[0].dtype
    _out_dtype_check(a, out)
    return jnp.matmul(a, b, precision=precision(), preferred_element_type=out).astype(out)


@lower(aten.addmm.dtype, static=("beta", "alpha"), operands=("self", "mat1", "mat2"),
       products=True)
def addmm_out_dtype(bias, a, b, out_dtype, *, beta=1, alpha=1, meta):
    out = meta[0].dtype
    _out_dtype_check(a, out)
    prod = jnp.matmul(a, b, precision=precision(), preferred_element_type=out)
    return _scaled_sum(bias.astype(out), prod.astype(out), beta, alpha)


@lower(aten.vdot.default, promote="default", products=True)
def vdot(a, b):
    return matmul(jnp.conj(a), b)


@lower(aten._int_mm.default)
def int_mm(a, b):
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


def _scaled_sum(bias, prod, beta, alpha):
    """beta * bias + alpha * prod; a zero beta ignores bias (even NaN), as PyTorch does."""
    if prod.dtype == jnp.bool_:
        prod = prod & bool(alpha)
        return prod if not beta else prod | (bias.astype(bool) & bool(beta))
    skip_bias = beta == 0
    if is_int(prod):  # the scalars are cast to the integer type (truncated)
        alpha, beta = int(alpha.real if isinstance(alpha, complex) else alpha), \
            int(beta.real if isinstance(beta, complex) else beta)
    if alpha != 1:
        prod = prod * alpha
    if skip_bias:
        return prod
    if beta != 1:
        bias = bias * beta
    return bias + prod


# alpha and beta are static (a zero beta changes the program) and stay out of promotion.
@lower(aten.addmm.default, promote="default", static=("beta", "alpha"),
       operands=("self", "mat1", "mat2"), products=True)
def addmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, matmul(a, b), beta, alpha)


@lower(aten.baddbmm.default, promote="default", static=("beta", "alpha"),
       operands=("self", "batch1", "batch2"), products=True)
def baddbmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, matmul(a, b), beta, alpha)


@lower(aten.addmv.default, promote="default", static=("beta", "alpha"),
       operands=("self", "mat", "vec"), products=True)
def addmv(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, matmul(a, b), beta, alpha)


@lower(aten.addbmm.default, promote="default", static=("beta", "alpha"),
       operands=("self", "batch1", "batch2"), products=True)
def addbmm(bias, a, b, *, beta=1, alpha=1):
    prod = matmul(a, b)
    prod = jnp.any(prod, axis=0) if prod.dtype == jnp.bool_ else jnp.sum(prod, axis=0)
    return _scaled_sum(bias, prod, beta, alpha)


@lower(aten.addr.default, promote="default", static=("beta", "alpha"),
       operands=("self", "vec1", "vec2"))
def addr(bias, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_sum(bias, vec1[:, None] * vec2[None, :], beta, alpha)


@lower(aten.trace.default)
def trace(x):
    d = jnp.diagonal(x)
    return jnp.sum(d.astype(jnp.int64) if is_int(x) else d)


@lower(aten.linalg_cross.default, promote="default")
def linalg_cross(a, b, *, dim=-1):
    a, b = jnp.broadcast_arrays(a, b)
    return jnp.cross(a, b, axis=dim)


# ------------------------------------------------------------------ helpers
def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if is_complex(x) else _mT(x)


def _broadcast_batch(a, b):
    """a and b with their batch dimensions (all but the last two) broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (jnp.broadcast_to(a, batch + a.shape[-2:]),
            jnp.broadcast_to(b, batch + b.shape[-2:]))


def _first_failure(bad):
    """LAPACK's info: the 1-based index of the first True along the last axis, else 0."""
    n = bad.shape[-1]
    if n == 0:
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    first = jnp.argmax(bad, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(bad, axis=-1), first, 0)


def _check_info(info, op: str, message: str) -> None:
    checks.require(info == 0, torch.linalg.LinAlgError, f"{op}: {message}")


def _lu(a):
    """(LU, 1-based int32 pivots, permutation, info) with partial pivoting."""
    lu, pivots, perm = lax_linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, pivots.astype(jnp.int32) + 1, perm, _first_failure(diag == 0)


def _perm_from_pivots(pivots, m):
    """The row permutation (0-based) that LAPACK's sequential 1-based swaps describe."""
    return lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _apply_rows(perm, b):
    """b[..., perm, :] with a batched permutation."""
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _unit_lower(lu, k):
    m = lu.shape[-2]
    lower = jnp.tril(lu[..., :, :k], -1)
    return lower + jnp.eye(m, k, dtype=lu.dtype)


def _lu_solve(lu, perm, b, adjoint):
    """Solve A x = b (or A^H x = b) from A[perm] = L U; b has a matrix on the right."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    solve = lax_linalg.triangular_solve
    if not adjoint:
        y = _apply_rows(perm, b)
        y = solve(lu, y, left_side=True, lower=True, unit_diagonal=True)
        return solve(lu, y, left_side=True, lower=False)
    y = solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = solve(lu, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True,
              unit_diagonal=True)
    inverse = jnp.argsort(perm, axis=-1)
    return _apply_rows(inverse, y)


# ------------------------------------------------------------------ LU family
@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, pivots, _, info = _lu(a)
    if check_errors:
        _check_info(info, "torch.linalg.lu_factor_ex", "The factorization could not be "
                    "completed because the input matrix is singular.")
    return lu, pivots, info


@lower(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    lu, _, perm, _ = _lu(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=a.dtype), -1, -2)
    return p, _unit_lower(lu, k), jnp.triu(lu[..., :k, :])


@lower(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    empty = jnp.zeros((0,), lu.dtype)
    if unpack_pivots:
        checks.require(jnp.all((pivots >= 1) & (pivots <= m)), RuntimeError,
                       "pivots passed to lu_unpack must be between 1 and LU.size(-2) "
                       "inclusive.Did you properly pass the result of lu_factor?")
        perm = _perm_from_pivots(pivots, m)
        p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu.dtype), -1, -2)
    else:
        p = empty
    if not unpack_data:
        return p, empty, empty
    return p, _unit_lower(lu, k), jnp.triu(lu[..., :k, :])


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    perm = _perm_from_pivots(pivots, lu.shape[-1])
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mH(_lu_solve(lu, perm, _mH(b), not adjoint))


def _vector_rhs(a, b) -> bool:
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    use_a_t = False  # unlike det/slogdet, torch 2.13 factors A itself here
    lu, pivots, perm, info = _lu(_mT(a) if use_a_t else a)
    if check_errors:
        _check_info(info, "torch.linalg.solve_ex", "The solver failed because the input "
                    "matrix is singular.")
    vector = _vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    if left:
        x = _lu_solve(lu, perm, rhs, use_a_t)
    else:
        x = _mH(_lu_solve(lu, perm, _mH(rhs), not use_a_t))
    return (x[..., 0] if vector else x), lu, pivots, info


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    lu, _, perm, info = _lu(a)
    if check_errors:
        _check_info(info, "torch.linalg.inv_ex", "The diagonal element "
                    "of the LU factorization is zero, the inversion could not be completed "
                    "because the input matrix is singular.")
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, perm, eye, False), info


def _perm_sign(pivots):
    k = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, k + 1, dtype=pivots.dtype), axis=-1)
    return 1 - 2 * (swaps % 2)


def _factors_a_t(a, contiguous) -> bool:
    """PyTorch's choice in det/slogdet and their backward: LU of A^T for a real A that is
    contiguous (a caller that cannot tell the layout passes None: contiguous assumed)."""
    return not is_complex(a) and (contiguous is None or bool(contiguous[0]))


@lower(aten._linalg_det.default)
def linalg_det(a, *, contiguous=None):
    use_a_t = _factors_a_t(a, contiguous)
    lu, pivots, _, _ = _lu(_mT(a) if use_a_t else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    det = jnp.prod(diag, axis=-1) * _perm_sign(pivots).astype(a.dtype)
    return det, lu, pivots


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(a, *, contiguous=None):
    use_a_t = _factors_a_t(a, contiguous)
    lu, pivots, _, _ = _lu(_mT(a) if use_a_t else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    absdiag = jnp.abs(diag)
    unit = jnp.where(absdiag == 0, 0, diag / jnp.where(absdiag == 0, 1, absdiag).astype(a.dtype))
    sign = jnp.prod(unit, axis=-1) * _perm_sign(pivots).astype(a.dtype)
    return sign, jnp.sum(jnp.log(absdiag), axis=-1), lu, pivots


# ------------------------------------------------------------------ Cholesky
def _cholesky_lower(a):
    """The lower Cholesky factor from A's lower triangle (as LAPACK's potrf), and info."""
    chol = lax_linalg.cholesky(a, symmetrize_input=False)
    diag = jnp.diagonal(chol, axis1=-2, axis2=-1)
    return jnp.tril(chol), _first_failure(~jnp.isfinite(jnp.real(diag)))


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    # upper=True factors A = U^H U from A's upper triangle, i.e. (the lower factor of A^H)^H.
    lower_factor, info = _cholesky_lower(_mH(a) if upper else a)
    if check_errors:
        _check_info(info, "torch.linalg.cholesky_ex", "The factorization could not be "
                    "completed because the input is not positive-definite.")
    return (_mH(lower_factor) if upper else lower_factor), info


@lower(*_compat.aten_overloads("cholesky.default"))  # gone from torch 2.14 on
def cholesky(a, upper=False):
    lower_factor, info = _cholesky_lower(_mH(a) if upper else a)
    _check_info(info, "cholesky", "The factorization could not be completed because the "
                "input is not positive-definite.")
    return _mH(lower_factor) if upper else lower_factor


@lower(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, factor, upper):
    factor, b = _broadcast_batch(factor, b)
    solve = lax_linalg.triangular_solve
    if upper:  # A = U^H U
        y = solve(factor, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
        return solve(factor, y, left_side=True, lower=False)
    y = solve(factor, b, left_side=True, lower=True)
    return solve(factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return cholesky_solve_helper(eye, factor, upper)


# ------------------------------------------------------------------ triangular
@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a, b = _broadcast_batch(a, b)
    x = lax_linalg.triangular_solve(a, b, left_side=True, lower=not upper,
                                    transpose_a=transpose, unit_diagonal=unitriangular)
    return x, a


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = _broadcast_batch(a, b)
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                       unit_diagonal=unitriangular)


# ------------------------------------------------------------------ QR, Householder
@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    q, r = lax_linalg.qr(a, full_matrices=mode == "complete")
    if mode == "r":
        return jnp.zeros((0,), a.dtype), r
    return q, r


def _geqrf_meta(a):
    m, n = a.shape[-2:]
    return torch.empty_like(a), a.new_empty((*a.shape[:-2], min(m, n)))


def _register_missing_meta() -> None:
    """PyTorch has no meta kernel for geqrf; the executor needs one."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::geqrf", "Meta"):
        lib = torch.library.Library("aten", "IMPL", "Meta")
        lib.impl("geqrf", _geqrf_meta)
        _meta_libs.append(lib)


_meta_libs: list = []
_register_missing_meta()


@lower(aten.geqrf.default)
def geqrf(a):
    return _geqrf(a)  # LAPACK's compact form: reflectors below the diagonal, and tau


@lower(aten.linalg_householder_product.default)
def householder_product(a, tau):
    return lax_linalg.householder_product(a, tau)


@lower(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    return lax_linalg.ormqr(a, tau, c, left=left, transpose=transpose)


# ------------------------------------------------------------------ spectral
@lower(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        s = lax_linalg.svd(a, full_matrices=False, compute_uv=False)
        empty = jnp.zeros((0,), a.dtype)
        return empty, s, empty
    u, s, vh = lax_linalg.svd(a, full_matrices=full_matrices, compute_uv=True)
    return u, s, vh


@lower(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    v, w = lax_linalg.eigh(a, lower=UPLO == "L", symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@lower(aten.linalg_eig.default)
def linalg_eig(a):
    """Eigen-decomposition of a general matrix (XLA has it on the CPU only)."""
    w, v = lax_linalg.eig(a, compute_left_eigenvectors=False)
    return w, v


@lower(aten._linalg_eigvals.default)
def linalg_eigvals(a):
    w, = lax_linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=False)
    return w


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    import jax.scipy.linalg as jsl

    return jsl.expm(a)
