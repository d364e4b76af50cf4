// What the native sources of torch-pjrt share (shim.cpp, op_kernel.cpp, profiler.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;

// A tensor on a new pjrt storage from the native allocator, on device `index`.
at::Tensor empty_pjrt(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                      int index);

// One pjrt op at a time in a process: each op's kernel, and the run of the pending fused
// graph, hold this lock, so threads take turns (re-entrant; it waits without the GIL).
void lock_ops();
void unlock_ops();

struct OpsLocked {
  OpsLocked() { lock_ops(); }
  ~OpsLocked() { unlock_ops(); }
  OpsLocked(const OpsLocked&) = delete;
  OpsLocked& operator=(const OpsLocked&) = delete;
};

// op_kernel.cpp: the op cache key, new_tensor, and the kernel of lowered ops.
void add_op_kernel(pybind11::module& m);

// profiler.cpp: torch.profiler's device activities (a Kineto child profiler).
void add_profiler(pybind11::module& m);

}  // namespace torch_pjrt
