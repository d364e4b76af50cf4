// What the native sources of torch-pjrt share (shim.cpp, op_kernel.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;

// A tensor on a new pjrt storage from the native allocator, on device `index`.
at::Tensor empty_pjrt(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                      int index);

// The storage table's free (storage/table.py) of the storage with this handle (a Python
// int), done natively; false where table.free must be called instead. GIL held.
bool free_storage(PyObject* key);

// op_kernel.cpp: the op cache key, new_tensor, and the kernel of lowered ops.
void add_op_kernel(pybind11::module& m);

}  // namespace torch_pjrt
