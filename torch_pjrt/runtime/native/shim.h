// What the native sources of torch-pjrt share (shim.cpp, op_kernel.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;

// A tensor on a new pjrt storage from the native allocator, on device `index`.
at::Tensor empty_pjrt(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                      int index);

// op_kernel.cpp: the op cache key, new_tensor, and the kernel of lowered ops.
void add_op_kernel(pybind11::module& m);

}  // namespace torch_pjrt
