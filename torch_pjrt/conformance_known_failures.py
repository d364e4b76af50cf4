"""Known OpInfo conformance failures on pjrt (float32): op name[.variant] -> one-line reason.

Data for torch_pjrt.conformance: a listed op that fails is an expected failure,
an unlisted failure fails tests/lowering/test_opinfo.py, and a listed op that
passes every sample is reported as fixed (delete its line). Regenerate the
report with `python -m torch_pjrt ops --report` (docs/op-coverage.md).
"""

# Causes shared by several ops.
_BATCH_NORM_EVAL = "eval mode: save_mean/invstd of shape [C], the CPU's are [0] (as CUDA's)"
_CHUNK_NO_DERIVATIVE = "chunk is CompositeImplicitAutograd but a pjrt kernel: no derivative"
_FFT_REAL = "wrong values for a real input to a complex transform"
_INDEX_SELECT_0D = "index_select lowering fails on a 0-d index or input"
_LOG_SOFTMAX_BACKWARD_0D = "_log_softmax_backward_data lowering fails on 0-d input"
_NARROW_NO_DERIVATIVE = "narrow is CompositeImplicitAutograd but a pjrt kernel: no derivative"
_PARTIAL_VIEW = "a moved partial view gets its own storage: as_strided reads other data"
_POLYGAMMA_POLES = "imprecise near the poles (abs. error ~35 on values ~1e5)"
_POLYNOMIAL_N = "non-integer n handled unlike the CPU kernel (PyTorch xfails it too)"
_SCATTER_OPERANDS = "scatter.src/.value lowering names an operand one lacks: KeyError in promotion"
_SOFTMAX_BACKWARD_0D = "_softmax_backward_data lowering fails on 0-d input"
_SOLVE_BACKWARD = "wrong gradient (the backward's lu_solve on _linalg_solve_ex's LU and pivots)"
_SPARSE = "sparse layouts are not supported on pjrt"
_TOO_MANY_SAMPLES = "1440 samples, one compile each: past the sweep's 120 s per-op time limit"

FORWARD: dict[str, str] = {
    "_native_batch_norm_legit": _BATCH_NORM_EVAL,
    "as_strided.partial_views": _PARTIAL_VIEW,
    "chalf": "complex32 (chalf) is not a pjrt dtype",
    "fft.hfft2": "wrong values (hfft2)",
    "fft.hfftn": "wrong values (hfftn)",
    "fft.ifft": _FFT_REAL,
    "fft.ihfft": _FFT_REAL,
    "fft.ihfft2": _FFT_REAL,
    "fft.ihfftn": _FFT_REAL,
    "gather": "gather lowering fails on 0-d input or index",
    "index_select": _INDEX_SELECT_0D,
    "matrix_exp": "less precise than the CPU (abs. error ~2e-3 on values ~1e4)",
    "max_pool2d_with_indices_backward": _TOO_MANY_SAMPLES,
    "native_batch_norm": _BATCH_NORM_EVAL,
    "nn.functional.max_pool2d": _TOO_MANY_SAMPLES,
    "nn.functional.multi_head_attention_forward":
        "wrong values with bias_k/bias_v and a float attn_mask (sample 126)",
    "polygamma.polygamma_n_0": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_1": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_2": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_3": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_4": _POLYGAMMA_POLES,
    "scatter": _SCATTER_OPERANDS,
    "scatter_reduce.amax": "scatter_reduce lowering lacks the amin/amax reductions",
    "scatter_reduce.amin": "scatter_reduce lowering lacks the amin/amax reductions",
    "sparse.mm.reduce": _SPARSE,
    "sparse.sampled_addmm": _SPARSE,
    "special.chebyshev_polynomial_t": _POLYNOMIAL_N,
    "special.chebyshev_polynomial_u": _POLYNOMIAL_N,
    "special.chebyshev_polynomial_v": _POLYNOMIAL_N,
    "special.chebyshev_polynomial_w": _POLYNOMIAL_N,
    "special.hermite_polynomial_h": _POLYNOMIAL_N,
    "special.hermite_polynomial_he": _POLYNOMIAL_N,
    "special.laguerre_polynomial_l": _POLYNOMIAL_N,
    "special.legendre_polynomial_p": _POLYNOMIAL_N,
    "special.polygamma.special_polygamma_n_0": _POLYGAMMA_POLES,
    "special.shifted_chebyshev_polynomial_t": _POLYNOMIAL_N,
    "special.shifted_chebyshev_polynomial_u": _POLYNOMIAL_N,
    "special.shifted_chebyshev_polynomial_v": _POLYNOMIAL_N,
    "special.shifted_chebyshev_polynomial_w": _POLYNOMIAL_N,
    "to_sparse": _SPARSE,
}

BACKWARD: dict[str, str] = {
    "as_strided.partial_views": _PARTIAL_VIEW,
    "chalf": "complex32 (chalf) is not a pjrt dtype",
    "chunk": _CHUNK_NO_DERIVATIVE,
    "conj_physical":
        "conj_physical is CompositeImplicitAutograd but lowered: autograd dropped (grad None)",
    "cumprod": _SCATTER_OPERANDS,
    "diff": _NARROW_NO_DERIVATIVE,
    "fft.hfft2": "wrong values (hfft2)",
    "fft.hfftn": "wrong values (hfftn)",
    "fft.ifft": _FFT_REAL,
    "fft.ihfft": _FFT_REAL,
    "fft.ihfft2": _FFT_REAL,
    "fft.ihfftn": _FFT_REAL,
    "gather": "gather lowering fails on 0-d input or index",
    "index_fill": _INDEX_SELECT_0D,
    "index_reduce.amax": _INDEX_SELECT_0D,
    "index_reduce.amin": _INDEX_SELECT_0D,
    "index_reduce.mean": _INDEX_SELECT_0D,
    "index_reduce.prod": _INDEX_SELECT_0D,
    "index_select": _INDEX_SELECT_0D,
    "kthvalue": _SCATTER_OPERANDS,
    "linalg.cond": _NARROW_NO_DERIVATIVE,
    "linalg.eig":
        "eig backward's phase-invariance check trips on pjrt's rounding (the CPU passes it)",
    "linalg.eigvals": "wrong gradient (complex backward: conjugate views are ignored)",
    "linalg.householder_product": "backward less precise than the CPU (abs. error ~5e-3)",
    "linalg.solve": _SOLVE_BACKWARD,
    "linalg.solve_ex": _SOLVE_BACKWARD,
    "linalg.tensorsolve": _SOLVE_BACKWARD,
    "log_softmax": _LOG_SOFTMAX_BACKWARD_0D,
    "log_softmax.with_dtype": _LOG_SOFTMAX_BACKWARD_0D,
    "logcumsumexp": "backward less precise than the CPU (abs. error ~5e-3)",
    "masked.log_softmax": _LOG_SOFTMAX_BACKWARD_0D,
    "masked.median": _SCATTER_OPERANDS,
    "masked.softmax": _SOFTMAX_BACKWARD_0D,
    "masked.softmin": _SOFTMAX_BACKWARD_0D,
    "matrix_exp": "less precise than the CPU (abs. error ~2e-3 on values ~1e4)",
    "max.reduction_with_dim": _SCATTER_OPERANDS,
    "median": _SCATTER_OPERANDS,
    "min.reduction_with_dim": _SCATTER_OPERANDS,
    "mode": _SCATTER_OPERANDS,
    "msort": _SCATTER_OPERANDS,
    "nanmedian": _SCATTER_OPERANDS,
    "nanquantile": _SCATTER_OPERANDS,
    "narrow": _NARROW_NO_DERIVATIVE,
    "nn.functional.max_pool2d": _TOO_MANY_SAMPLES,
    "nn.functional.softmin": _SOFTMAX_BACKWARD_0D,
    "nn.functional.softmin.with_dtype": _SOFTMAX_BACKWARD_0D,
    "polar": "wrong gradient for abs (conjugate views are ignored, see conj bit)",
    "polygamma.polygamma_n_0": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_1": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_2": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_3": _POLYGAMMA_POLES,
    "polygamma.polygamma_n_4": _POLYGAMMA_POLES,
    "quantile": _SCATTER_OPERANDS,
    "scatter": _SCATTER_OPERANDS,
    "scatter_reduce.amax": _SCATTER_OPERANDS,
    "scatter_reduce.amin": _SCATTER_OPERANDS,
    "scatter_reduce.mean": _SCATTER_OPERANDS,
    "scatter_reduce.prod": _SCATTER_OPERANDS,
    "scatter_reduce.sum": _SCATTER_OPERANDS,
    "softmax": _SOFTMAX_BACKWARD_0D,
    "softmax.with_dtype": _SOFTMAX_BACKWARD_0D,
    "sort": _SCATTER_OPERANDS,
    "sparse.mm.reduce": _SPARSE,
    "sparse.sampled_addmm": _SPARSE,
    "special.polygamma.special_polygamma_n_0": _POLYGAMMA_POLES,
    "to_sparse": _SPARSE,
    "topk": _SCATTER_OPERANDS,
}

KNOWN_FAILURES: dict[str, dict[str, str]] = {"forward": FORWARD, "backward": BACKWARD}
