"""Known wrong results of the math families' edge-value tests, one reason each.

These are strict expected failures: when a fix makes one pass, the test fails
until its line is deleted, so the list only shrinks. (The OpInfo sweep keeps its
own list in torch_pjrt/conformance_known_failures.py.)
"""

import pytest

_BESSEL = "Bessel/modified Bessel: wrong value at +-inf or NaN (finite arguments match)"
_COMPLEX_SPECIAL = ("complex64 with inf/NaN parts: XLA's formula differs from the CPU's C99 "
                    "special-value rules (finite arguments match)")

# (test_linalg.py::test_gauge_free_decompositions, a slow test: eigh does not reconstruct
# its input on one OpInfo sample; the svd check mishandles empty inputs.)
KNOWN_FAILING: dict[str, str] = {
    **{f"test_elementwise.py::test_unary_edge_values[{op}-torch.{dt}]": _BESSEL
       for op in ("bessel_j0", "bessel_y0", "bessel_y1", "k0", "k1e")
       for dt in ("float32", "float64")},
    **{f"test_elementwise.py::test_unary_edge_values[{op}-torch.complex64]": _COMPLEX_SPECIAL
       for op in ("expm1", "pow_half", "pow_neg_half", "pow_neg_one", "pow_third",
                  "reciprocal", "rsqrt", "sigmoid", "sqrt")},
    **{f"test_elementwise.py::test_binary_edge_values[{op}-torch.complex64]": _COMPLEX_SPECIAL
       for op in ("add", "sub", "div", "logaddexp", "pow")},
    "test_elementwise.py::test_binary_edge_values[fmod-torch.float32]":
        "a subnormal divisor: XLA:CPU flushes subnormals to zero (NaN), the CPU does not",
    "test_elementwise.py::test_binary_edge_values[remainder-torch.float32]":
        "a subnormal divisor: XLA:CPU flushes subnormals to zero (NaN), the CPU does not",
    "test_elementwise.py::test_binary_edge_values[gcd-torch.int64]":
        "gcd with INT64_MIN: off by 2**32 (the CPU's own result overflows differently)",
    "test_elementwise.py::test_binary_edge_values[igammac-torch.float32]":
        "igammac at inf/NaN edges",
    "test_elementwise.py::test_binary_edge_values[igammac-torch.float64]":
        "igammac at inf/NaN edges",
    "test_linalg.py::test_addmm_zero_beta_ignores_nan_bias":
        "the test's addmv bias has the wrong size: the CPU raises first (a test bug)",
    "test_linalg.py::test_cholesky_info_and_check_errors":
        "cholesky_ex info is 1 where LAPACK reports the failing minor's order (2)",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.nodeid.split("tests/lowering/", 1)[-1]
        reason = KNOWN_FAILING.get(name)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
