"""Matrix products and torch.linalg on pjrt against the CPU: OpInfo samples (forward, and
backward for real dtypes), integer and bool products, LAPACK conventions (pivots, info),
and gauge-free comparisons for eigenvectors and singular vectors."""

import pytest
import torch
from helpers import assert_same, compare, to_device
from math_diff import check_opinfo, fallbacks, new_fallbacks

REAL = (torch.float32, torch.float64)
ALL = (torch.float32, torch.float64, torch.complex64)

PRODUCTS = ("mm", "bmm", "mv", "dot", "vdot", "addmm", "addmm.decomposed", "addmv",
            "addbmm", "baddbmm", "addr", "matmul", "inner", "kron", "tensordot", "einsum",
            "trace", "linalg.cross", "linalg.multi_dot", "linalg.matrix_power", "chain_matmul")

# ops whose results are unique (no sign or phase freedom): compared directly
FACTORIZATIONS = (
    "linalg.cholesky", "linalg.cholesky_ex", "cholesky", "cholesky_solve", "cholesky_inverse",
    "linalg.inv", "linalg.inv_ex", "linalg.solve", "linalg.solve_ex", "linalg.lu_factor",
    "linalg.lu_factor_ex", "linalg.lu", "lu", "lu_unpack", "linalg.lu_solve", "lu_solve",
    "linalg.det", "linalg.slogdet", "logdet", "linalg.qr", "qr", "triangular_solve",
    "linalg.solve_triangular", "linalg.householder_product", "geqrf", "ormqr",
    "linalg.matrix_exp", "linalg.eigvalsh", "linalg.svdvals", "linalg.matrix_rank",
    "linalg.pinv", "linalg.pinv.hermitian", "linalg.matrix_norm", "linalg.norm",
    "linalg.cond", "linalg.tensorinv", "linalg.tensorsolve", "linalg.vecdot", "linalg.eigvals",
)


def _split(full):
    if full.startswith("linalg."):
        name, _, variant = full[len("linalg."):].partition(".")
        return "linalg." + name, variant
    name, _, variant = full.partition(".")
    return name, variant


@pytest.mark.slow
@pytest.mark.parametrize("full", PRODUCTS)
def test_products_opinfo(full):
    name, variant = _split(full)
    check_opinfo(name, variant, dtypes=(*ALL, torch.int64), scale=4.0)


# Complex inputs use conjugate views (mH) that the executor does not yet read
# conjugated (see the report); they are covered forward by the real dtypes' algorithms.
_COMPLEX_VIEWS = {"linalg.pinv", "linalg.pinv.hermitian", "linalg.vecdot", "linalg.cond",
                  "linalg.matrix_rank", "linalg.matrix_norm", "linalg.norm"}


@pytest.mark.slow
@pytest.mark.parametrize("full", FACTORIZATIONS)
def test_factorizations_opinfo(full):
    name, variant = _split(full)
    check_opinfo(name, variant, dtypes=REAL, scale=10.0)
    if full not in _COMPLEX_VIEWS:  # complex backward formulas use conjugate views too
        check_opinfo(name, variant, dtypes=(torch.complex64,), grad=False, scale=10.0)


# ------------------------------------------------------------------ gauge-free
def _check_eigh(actual, expected, sample):
    w, v = actual
    we, ve = expected
    assert_same(w, we, atol=1e-4, rtol=1e-4)
    a = sample.input
    if isinstance(a, torch.Tensor) and v.numel():
        uplo = sample.kwargs.get("UPLO", "L")
        herm = a.tril() + a.tril(-1).mH if uplo == "L" else a.triu() + a.triu(1).mH
        vc = v.cpu()
        recon = vc @ torch.diag_embed(w.cpu().to(vc.dtype)) @ vc.mH
        torch.testing.assert_close(recon, herm.detach(), atol=1e-3, rtol=1e-3)


def _check_svd(actual, expected, sample):
    u, s, vh = (t.cpu() for t in actual)
    _, se, _ = expected
    torch.testing.assert_close(s, se, atol=1e-4, rtol=1e-4)
    recon = u[..., :, : s.shape[-1]] @ torch.diag_embed(s.to(u.dtype)) @ vh[..., : s.shape[-1], :]
    torch.testing.assert_close(recon, sample.input.detach(), atol=1e-3, rtol=1e-3)


def _check_eig(actual, expected, sample):
    w, v = (t.cpu() for t in actual)
    a = sample.input.detach().to(w.dtype)
    torch.testing.assert_close(a @ v, v * w.unsqueeze(-2), atol=1e-3, rtol=1e-3)
    key = lambda t: torch.sort(t.real * 1e3 + t.imag, dim=-1).values  # noqa: E731
    torch.testing.assert_close(key(w), key(expected[0]), atol=1e-3, rtol=1e-3)


# Slow, and once crashed XLA:CPU (a segfault inside an eig/svd program run): kept out of
# CI until that is found.
@pytest.mark.slow
@pytest.mark.parametrize("name,check", [("linalg.eigh", _check_eigh), ("linalg.svd", _check_svd),
                                        ("svd", _check_svd), ("linalg.eig", _check_eig)],
                         ids=["eigh", "linalg.svd", "svd", "eig"])
def test_gauge_free_decompositions(name, check):
    check_opinfo(*_split(name), dtypes=ALL, grad=False, check=check)


def test_eigh_and_svd_gradients_of_invariants():
    a = torch.randn(4, 4, dtype=torch.float64)
    a = a + a.mT

    def f(t):
        t = t.requires_grad_(True)
        w = torch.linalg.eigvalsh(t)
        s = torch.linalg.svdvals(t)
        return torch.autograd.grad((w * w).sum() + s.sum(), t)[0]

    compare(f, a)


# ------------------------------------------------------------------ conventions
def test_integer_and_bool_products():
    a = torch.randint(-2**40, 2**40, (3, 4))
    b = torch.randint(-2**20, 2**20, (4, 5))
    compare(lambda a, b: (a @ b, torch.addmm(a @ b, a, b, beta=2, alpha=3), a[0] @ b[:, 0]),
            a, b, atol=0, rtol=0)
    i8 = torch.randint(-128, 127, (32, 16), dtype=torch.int8)
    # against the exact product, not the CPU's kernel: on x86 without AVX512-VNNI, oneDNN's
    # int8 kernel saturates its 16-bit partial sums (210 of 1,024 wrong, by up to 23,409,
    # with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2; docs/testing.md)
    got = torch._int_mm(i8.to("pjrt"), i8.t().contiguous().to("pjrt"))
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), (i8.long() @ i8.t().long()).int())


def test_addmm_zero_beta_ignores_nan_bias():
    bias = torch.full((2, 3), float("nan"))
    a, b = torch.randn(2, 4), torch.randn(4, 3)
    compare(lambda c, a, b: (torch.addmm(c, a, b, beta=0), torch.addmm(c, a, b, beta=0.0),
                             torch.addmv(c[0], a, b[:, 0], beta=0)), bias, a, b)


def test_lu_pivots_and_info():
    a = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
    compare(lambda t: torch.linalg.lu_factor_ex(t), a)  # singular: info = 3
    compare(lambda t: torch.linalg.lu_factor_ex(t), torch.randn(2, 4, 3, dtype=torch.float64))
    compare(lambda t: torch.linalg.lu_factor_ex(t), torch.randn(3, 5, dtype=torch.float64))


def test_lu_unpack_takes_lu_factor_pivots_and_refuses_others():
    # the CPU check of the stand-ins (all-0 and all-1-byte pivots) refused every call
    a = torch.randn(2, 3, 3, dtype=torch.float64)
    compare(lambda t: torch.lu_unpack(*torch.linalg.lu_factor(t)), a)
    lu, pivots = torch.linalg.lu_factor(a)
    bad = pivots.clone()
    bad[0, 0] = 0
    with pytest.raises(RuntimeError, match="pivots passed to lu_unpack must be between"):
        torch.lu_unpack(lu.to("pjrt"), bad.to("pjrt"))[0].cpu()


def test_cholesky_info_and_check_errors():
    a = torch.tensor([[4.0, 2.0], [2.0, -3.0]])
    _, info = torch.linalg.cholesky_ex(a.to("pjrt"))
    assert info.item() == torch.linalg.cholesky_ex(a)[1].item() == 2
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(a.to("pjrt")).cpu()
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(torch.zeros(2, 2, device="pjrt")).cpu()


def test_cholesky_reads_one_triangle():
    a = torch.randn(4, 4, dtype=torch.float64)
    spd = a @ a.mT + 4 * torch.eye(4, dtype=torch.float64)
    garbage = spd.tril() + torch.triu(torch.full((4, 4), 100.0, dtype=torch.float64), 1)
    compare(lambda t: (torch.linalg.cholesky(t), torch.linalg.cholesky(t.mT, upper=True)),
            garbage)


def test_solve_vector_rhs_left_and_right():
    a = torch.randn(2, 3, 3, dtype=torch.float64)
    b = torch.randn(2, 3, dtype=torch.float64)
    compare(lambda a, b: (torch.linalg.solve(a, b), torch.linalg.solve(a, b[0]),
                          torch.linalg.solve(a, b.unsqueeze(-1).expand(2, 3, 4), left=True),
                          torch.linalg.solve(a, b.unsqueeze(-2).expand(2, 4, 3), left=False)),
            a, b)


def test_solve_and_det_gradients():
    a = torch.randn(3, 3, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    b = torch.randn(3, 2, dtype=torch.float64)

    def f(a, b):
        a, b = a.requires_grad_(True), b.requires_grad_(True)
        out = (torch.linalg.solve(a, b).sum() + torch.linalg.det(a) + torch.linalg.slogdet(a)[1]
               + torch.linalg.inv(a).sum())
        return torch.autograd.grad(out, (a, b))

    before = fallbacks()
    compare(f, a, b)
    assert not new_fallbacks(before)


def test_triangular_solve_broadcasts_batches():
    a = torch.randn(1, 3, 3, dtype=torch.float64).triu() + 3 * torch.eye(3, dtype=torch.float64)
    b = torch.randn(4, 3, 2, dtype=torch.float64)
    compare(lambda a, b: (torch.triangular_solve(b, a), torch.triangular_solve(b, a, False, True),
                          torch.linalg.solve_triangular(a, b, upper=True),
                          torch.linalg.solve_triangular(a.mT, b.mT, upper=False, left=False,
                                                        unitriangular=True)), a, b)


def test_matrix_exp_matches_within_float_precision():
    a = torch.randn(3, 4, 4, dtype=torch.float64)
    compare(torch.linalg.matrix_exp, a, atol=1e-10, rtol=1e-10)
    expected = torch.linalg.matrix_exp(a.float())
    actual = torch.linalg.matrix_exp(to_device(a.float())).cpu()
    assert ((actual - expected).abs().max() / expected.abs().max()) < 1e-5
