"""Known OpInfo conformance failures on pjrt (float32): op name[.variant] -> one-line reason.

Data for torch_pjrt.conformance: a listed op that fails is an expected failure,
an unlisted failure fails tests/lowering/test_opinfo.py, and a listed op that
passes every sample is reported as fixed (delete its line). Regenerate the
report with `python -m torch_pjrt ops --report` (docs/op-coverage.md).

ERROR_INPUTS is the same for the error-input sweep (torch_pjrt/conformance_errors.py,
`python -m torch_pjrt ops --errors --report`, docs/error-inputs.md): ops some of whose
error inputs pjrt does not reject with the CPU's exception type; a name is
`op[.variant]` (every mode) or `op[.variant]@mode`.
"""

_BATCH_NORM_EVAL = ("eval mode: save_mean/invstd of shape [C] as the meta kernel (and CUDA) "
                    "give them; the CPU's are [0]. Not read by the eval backward")
_PARTIAL_VIEW = ("not an error: as on CUDA, .to() copies a partial view into a storage of "
                 "its own, so as_strided over it reads other elements than over the CPU's")

FORWARD: dict[str, str] = {
    "_native_batch_norm_legit": _BATCH_NORM_EVAL,
    "as_strided.partial_views": _PARTIAL_VIEW,
    "matrix_exp": "less precise than the CPU (abs. error ~7e-2 on values ~1e4, sample 1)",
    "native_batch_norm": _BATCH_NORM_EVAL,
    "nn.functional.multi_head_attention_forward":
        "sample 126 of 200 (inputs ~9, logits ~100): baddbmm's float32 rounding (5e-4, "
        "every op matches alone) amplified by softmax to 0.028 > atol 0.005",
}

BACKWARD: dict[str, str] = {
    "as_strided.partial_views": _PARTIAL_VIEW,
    "linalg.householder_product": "backward less precise than the CPU (abs. error ~5e-3)",
    "logcumsumexp": "backward less precise than the CPU (abs. error ~5e-3)",
    "matrix_exp": "less precise than the CPU (abs. error ~5e-3)",
}

KNOWN_FAILURES: dict[str, dict[str, str]] = {"forward": FORWARD, "backward": BACKWARD}

ERROR_INPUTS: dict[str, str] = {
    "cat@compile":
        "input 7, cat([empty, x], out=x): AOTAutograd makes out= a functional cat and a "
        "copy, which no kernel refuses; torch.compile on the CPU accepts it too (aot_eager, "
        "the call compiled alone), though the sweep's aot_eager reference raised",
}
