"""Known failures of PyTorch's own tests on pjrt (tools/pytorch_tests.py), each with its reason.

KNOWN maps a test file to {pattern: (reason, run)}: the pattern is fnmatch's, over the test's
device-free id (`TestShapeOps.test_flip_float32`); run=False keeps the test from running at
all (a crash or a hang would cost the run its time), run=True runs it and reports its failure
apart from the new ones. A reason says why pjrt differs, never "not implemented yet".
"""

from __future__ import annotations

from fnmatch import fnmatchcase

KNOWN: dict[str, dict[str, tuple[str, bool]]] = {
    "test_shape_ops.py": {
        "TestShapeOps.test_flip_float32": (
            "flips quantized tensors (quantize_per_tensor): pjrt has no quantized tensors "
            "(XLA has no scale/zero-point type; quantized models run int8 with explicit "
            "scales)", True),
    },
    "test_view_ops.py": {
        "TestOldViewOps.test_flatten": (
            "flattens a quantized tensor (_empty_affine_quantized) after the float one: pjrt "
            "has no quantized tensors (XLA has no scale/zero-point type)", True),
        "TestOldViewOps.test_ravel": (
            "ravels a quantized tensor (_empty_affine_quantized) after the float one: pjrt "
            "has no quantized tensors (XLA has no scale/zero-point type)", True),
    },
    "test_sort_and_select.py": {
        "TestSortAndSelect.test_unique_dim": (
            "its NaN case expects unique(dim=0) of [nan, 0, 0, nan, nan, 1] in input order: the "
            "CPU sorts rows with a `<` comparator that NaN leaves without a consistent order "
            "(std::sort's result is then unspecified; insertion sort keeps the input order "
            "here); pjrt sorts NaN rows last, as torch.sort does, so the same rows and counts "
            "come in another order. The other cases pass", True),
    },
    "test_tensor_creation_ops.py": {
        "TestTensorCreation.test_float_to_int_conversion_finite_*": (
            "casts float32's largest and smallest values to integers, which C++ leaves "
            "undefined: the x86 CPU (and NumPy, the test's reference) gives the 'integer "
            "indefinite' INT_MIN for both, wrapped to the narrower types; XLA's convert "
            "saturates to the type's bounds, as ARM CPUs do (the test's nonfinite twin "
            "expects that on ARM). The in-range values match", True),
        "TestRandomTensorCreation.test_normal_std_error": (
            "expects the error for a negative std tensor at the normal() call: pjrt checks "
            "std's elements on the device and raises at the next synchronization (debug "
            "eager mode at the op), as it reports every data-dependent error; CUDA's kernel "
            "reads std.min() back to the host (a synchronization per call) to raise at the "
            "op. The error is raised, not lost (tests/lowering checks it)", True),
    },
    "test_reductions.py": {
        "TestReductions.test_quantile_float*": (
            "compile-bound, not wrong: quantile and nanquantile over random shapes, 8 q "
            "tensors, both keepdims, 5 interpolations and every dim, with out= (about 1,600 "
            "calls, most a new shape and so a new program: over 120 s, and over the 4 GB "
            "worker cap, where the CPU takes 2 s)", False),
    },
    "test_torch.py": {
        **{f"TestTorchDeviceType.test_masked_scatter_{dtype}": (
            "expects the error for a source shorter than the mask's True count at the "
            "masked_scatter_ call: pjrt counts the mask on the device and raises at the next "
            "synchronization (debug eager mode at the op), as it reports every data-dependent "
            "error; the CPU counts it on the host, and the test skips the case for CUDA, "
            "whose kernel checks it too. The error is raised, not lost "
            "(tests/lowering/test_sorting.py checks it)", True)
           for dtype in ("bfloat16", "float16", "float32", "float64", "complex64",
                         "complex128", "int8", "int16", "int32", "int64", "uint8")},
        "TestTorchDeviceType.test_grad_scaler_deprecated_warning": (
            "builds torch.cpu.amp.GradScaler for every device but CUDA and expects its "
            "deprecation message to name the device's type (torch.pjrt.amp.GradScaler); the "
            "class's message names cpu, so only the CPU and CUDA can pass it", True),
        "TestTorchDeviceType.test_grad_scaling_state_dict": (
            "expects a GradScaler's scale tensor on any device but CUDA to be a "
            "torch.FloatTensor, the CPU's legacy tensor type, which only CPU tensors are "
            "instances of (CUDA's branch asks for torch.cuda.FloatTensor)", True),
        "TestTorchDeviceType.test_broadcast_fn_map*": (
            "Tensor.map_ and map2_ call a Python function per element and are CPU-only in "
            "PyTorch (CUDA raises the same TypeError; the test returns early for CUDA "
            "tensors only)", True),
        "TestTorchDeviceType.test_tensor_storage_type_*": (
            "expects the CPU's legacy storage class (torch.FloatStorage...) for every device "
            "but CUDA; PyTorch's storage_type() looks the class up in the device's own module "
            "and gives a pjrt tensor torch.pjrt.FloatStorage, as it gives a CUDA one "
            "torch.cuda.FloatStorage (tests/storage/test_legacy.py), which is not the CPU's "
            "class: only the CPU and CUDA can pass the test", True),
    },
    "test_nn.py": {
        "TestNNDeviceType.test_one_hot": (
            "expects RuntimeError at one_hot's call for a class out of range (it skips that "
            "part on CUDA, XLA and MPS, which check on the device): pjrt checks the indices "
            "on the device and reports the error at the next synchronization (\"index 3 is "
            "out of bounds for dimension 1 with size 3 (in aten.scatter_.value\"); debug "
            "eager mode raises at the op. The valid cases pass", True),
        "TestNNDeviceType.test_TransformerEncoderLayer_empty": (
            "feeds a strided-layout nested tensor (torch.nested.nested_tensor without "
            "layout=torch.jagged) to TransformerEncoderLayer in eval mode, whose fast path "
            "PyTorch takes on PrivateUse1 devices too (_transformer_encoder_layer_fwd): ATen "
            "registers the strided nested-tensor kernels for the NestedTensorCPU and "
            "NestedTensorCUDA keys only, and pjrt has none under NestedTensorPrivateUse1 "
            "(even mul fails there); the jagged layout, a Python subclass over dense "
            "tensors, runs on pjrt. The dense empty-input cases pass", True),
        "TestNNDeviceType.test_upsamplingBiMode2d_nonsupported_dtypes_*_mode_bi*_uint8": (
            "expects every device but the CPU to refuse uint8 bilinear and bicubic "
            "interpolation (`device == \"cpu\"` in the test: CUDA's kernels have no uint8); "
            "pjrt interpolates uint8 as the CPU does, bit for bit (test_uint8_images_bit_exact in "
            "tests/lowering/test_upsample.py) instead of raising \"not implemented for\"",
            True),
    },
    "test_indexing.py": {
        "NumpyTests.test_trivial_fancy_out_of_bounds": (
            "expects IndexError at the indexing call itself: pjrt checks indices on the device "
            "and reports the error at the next synchronization (as CUDA's device assert, for "
            "which the test skips itself); debug eager mode raises at the op", True),
        "TestIndexing.test_index_put_accumulate_duplicate_indices": (
            "compile-bound, not wrong: 511 index lengths, each a new program for uniform_, "
            "cumsum, randn and index_put (over 120 s); the accumulation itself is in "
            "tests/lowering/test_index_put_and_copy.py", False),
        "TestIndexing.test_index_put_accumulate_large_tensor": (
            "2^31 + 5 element tensors (2 GB each, and their copies): over the runner's memory "
            "cap on the CPU as well", False),
    },
}


def _entry(file: str, test: str) -> tuple[str, bool] | None:
    for pattern, entry in KNOWN.get(file, {}).items():
        if fnmatchcase(test, pattern):
            return entry
    return None


def reason(file: str, test: str) -> str:
    """The reason `test` of `file` is known to fail, or ''."""
    entry = _entry(file, test)
    return entry[0] if entry else ""


def skip_reason(file: str, test: str) -> str:
    """The reason `test` of `file` is not run at all, or ''."""
    entry = _entry(file, test)
    return entry[0] if entry and not entry[1] else ""
