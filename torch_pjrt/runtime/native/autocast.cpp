// torch-pjrt autocast: the AutocastPrivateUse1 kernels, so that torch.autocast("pjrt")
// casts each op as CUDA autocast does. PyTorch registers its op lists for CUDA, CPU, XPU
// and MPS only; ATen's autocast_mode.h ships the lists (AT_FORALL_*) and the wrapper that
// casts a call's floating-point pjrt arguments before redispatching. This file applies
// them to the PrivateUse1 key, exactly as CUDA's registration does, and lets every other
// op fall through to the layers below (without it any unlisted op raises under autocast).
// torch_pjrt/amp.py holds the same policy as data for the tests and the docs.

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// The redispatch signatures in AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE name ATen's types
// unqualified.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// CUDA refuses binary_cross_entropy under autocast: its float16 inputs are usually the
// output of a sigmoid, which underflows; the logits form is safe and runs in float32.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "binary_cross_entropy (torch.nn.functional.binary_cross_entropy, "
              "torch.nn.BCELoss) is refused inside torch.autocast(\"pjrt\"), as on CUDA: "
              "its inputs, often a sigmoid's lower-precision output, lose the small "
              "probabilities it needs. Use binary_cross_entropy_with_logits "
              "(torch.nn.BCEWithLogitsLoss) on the logits, which autocast runs in float32.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define PJRT_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(PJRT_LOWER_PRECISION)
#undef PJRT_LOWER_PRECISION

#define PJRT_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(PJRT_FP32)
#undef PJRT_FP32

#define PJRT_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(PJRT_FP32_SET_OPT_DTYPE)
#undef PJRT_FP32_SET_OPT_DTYPE

  // norm's overloads without a dtype argument redispatch to the overload with one
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define PJRT_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(PJRT_PROMOTE)
#undef PJRT_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
