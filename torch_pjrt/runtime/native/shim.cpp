// torch-pjrt native shim: the runtime hooks that PyTorch does not forward to
// Python (device index, device guard, synchronize, generators, allocator).
// Everything else in torch-pjrt is Python; this file only connects PyTorch's
// C++ hook points to Python callbacks.

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include "shim.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

namespace py = pybind11;

std::vector<std::pair<const char*, void*>> torch_pjrt_cpu_kernels();  // cpu_kernels.cpp

namespace {

using torch_pjrt::kPjrt;

// A thread starts on the process's default device: pjrt:0, or pjrt:LOCAL_RANK in a
// multi-process job (set_default_device, before the client starts).
std::atomic<int> default_device{0};
thread_local c10::DeviceIndex current_device = c10::DeviceIndex(default_device.load());
std::atomic<int> known_device_count{-1};
bool shutting_down = false;

// Python callbacks, set once by torch_pjrt.runtime. Leaked on purpose: they
// must outlive every tensor, including those freed during interpreter exit.
py::object* free_callback = nullptr;   // free(ptr: int) -> None
py::object* sync_callback = nullptr;   // synchronize(device_index: int) -> None
py::object* count_callback = nullptr;  // device_count() -> int (starts the PJRT client)
py::object* known_count_callback = nullptr;  // known_count() -> int | None (starts nothing)
// A count given out before PJRT started, from the settings (known_count): the autograd
// engine and torch.accelerator ask for the count, which must not start PJRT in a CPU-only
// script. -1: none given.
std::atomic<int> predicted_count{-1};
py::object* resize_callback = nullptr;  // resize(old_ptr, new_ptr, nbytes) -> None
// copy(dest_ptr, src_ptr, nbytes) -> None: a copy-on-write storage (torch._lazy_clone) is
// written, and its shared buffer is copied to the fresh handle the allocator gave it.
py::object* copy_callback = nullptr;
// torch_pjrt.runtime.memory: the memory account behind the allocator's statistics
// (stats, reset_peak, reset_accumulated, empty_cache, memory_info).
py::object* memory_account = nullptr;
// Set once the PJRT client has started (runtime.ensure_initialized): before, the
// allocator reports itself uninitialized and torch.accelerator's memory calls read nothing.
std::atomic<bool> started{false};
// The dtypes a pjrt tensor can have on this platform (set by the storage layer at start),
// as c10::DeviceCapability's bits.
std::atomic<uint64_t> dtype_bits{0};

// The device count is asked of Python on first use: it starts the PJRT
// client, which `import torch` alone must not do.
c10::DeviceIndex device_count() {
  int n = known_device_count.load();
  if (n >= 0) return c10::DeviceIndex(n);
  if (count_callback == nullptr || shutting_down || !Py_IsInitialized()) return 1;
  py::gil_scoped_acquire gil;
  try {
    n = (*count_callback)().cast<int>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_pjrt: starting the PJRT client");
    n = 0;
  }
  known_device_count.store(n);
  return c10::DeviceIndex(n);
}

// The device count without starting the PJRT client where the settings decide it (the
// cpu platform): what the guard, the hooks and index checks use. The autograd engine asks
// every device guard for its count at the first backward pass, a DataLoader asks
// torch.accelerator.is_available() before it forks its workers, and a thread sets its
// device: in a CPU-only script none of these may start PJRT (JAX's threads, its malloc
// settings). Where only the client can tell (an accelerator plugin), it starts.
c10::DeviceIndex count_without_starting() {
  int n = known_device_count.load();
  if (n >= 0) return c10::DeviceIndex(n);
  n = predicted_count.load();
  if (n >= 0) return c10::DeviceIndex(n);
  if (known_count_callback != nullptr && !shutting_down && Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    try {
      py::object known = (*known_count_callback)();
      if (!known.is_none()) {
        n = known.cast<int>();
        predicted_count.store(n);
        return c10::DeviceIndex(n);
      }
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("torch_pjrt: counting devices before PJRT starts");
    }
  }
  return device_count();
}

c10::DeviceIndex check_index(c10::DeviceIndex index) {
  if (index < 0) return current_device;
  auto count = count_without_starting();
  TORCH_CHECK(
      index < count, "pjrt: invalid device index ", int(index),
      " (there are ", int(count), " pjrt devices)");
  return index;
}

void call_sync(c10::DeviceIndex index) {
  if (shutting_down || sync_callback == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  (*sync_callback)(int(index));
}

// ---------------------------------------------------------------- allocator
// Device memory belongs to XLA buffers that Python keeps in a table keyed by
// the storage's data pointer. The pointer is a unique, never-dereferenced
// handle: the device index in the top byte, a counter below.
// Runs on every storage's death, so it calls Python directly rather than through pybind11.
void free_handle(void* ptr) {
  if (shutting_down || free_callback == nullptr || !Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // a tensor may die while an exception propagates
  PyObject* handle = PyLong_FromSize_t(reinterpret_cast<uintptr_t>(ptr));
  PyObject* result = handle ? PyObject_CallOneArg(free_callback->ptr(), handle) : nullptr;
  Py_XDECREF(handle);
  if (result == nullptr) {
    PyObject* context = PyUnicode_FromString("torch_pjrt storage free");
    PyErr_WriteUnraisable(context);
    Py_XDECREF(context);
  }
  Py_XDECREF(result);
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
}

constexpr uint64_t kIndexShift = 52;
constexpr uint64_t kAlign = 256;

// What the Python memory account says, read as PyTorch's DeviceStats (GIL taken).
c10::CachingAllocator::Stat stat_of(const py::handle& d) {
  c10::CachingAllocator::Stat s;
  s.current = d["current"].cast<int64_t>();
  s.peak = d["peak"].cast<int64_t>();
  s.allocated = d["allocated"].cast<int64_t>();
  s.freed = d["freed"].cast<int64_t>();
  return s;
}

c10::CachingAllocator::StatArray stat_array_of(const py::handle& d) {
  // StatType's order: AGGREGATE, SMALL_POOL, LARGE_POOL
  constexpr const char* pools[] = {"all", "small_pool", "large_pool"};
  c10::CachingAllocator::StatArray a;
  static_assert(std::size(pools) == std::tuple_size_v<c10::CachingAllocator::StatArray>);
  for (size_t i = 0; i < a.size(); ++i) a[i] = stat_of(d[pools[i]]);
  return a;
}

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex index) {
  TORCH_CHECK(memory_account != nullptr, "pjrt: memory statistics before the shim's install");
  py::gil_scoped_acquire gil;
  py::object d = memory_account->attr("stats")(int(index));
  c10::CachingDeviceAllocator::DeviceStats s;
  s.allocation = stat_array_of(d["allocation"]);
  s.segment = stat_array_of(d["segment"]);
  s.active = stat_array_of(d["active"]);
  s.inactive_split = stat_array_of(d["inactive_split"]);
  s.allocated_bytes = stat_array_of(d["allocated_bytes"]);
  s.reserved_bytes = stat_array_of(d["reserved_bytes"]);
  s.active_bytes = stat_array_of(d["active_bytes"]);
  s.inactive_split_bytes = stat_array_of(d["inactive_split_bytes"]);
  s.requested_bytes = stat_array_of(d["requested_bytes"]);
  s.oversize_allocations = stat_of(d["oversize_allocations"]);
  s.oversize_segments = stat_of(d["oversize_segments"]);
  s.num_alloc_retries = d["num_alloc_retries"].cast<int64_t>();
  s.num_ooms = d["num_ooms"].cast<int64_t>();
  s.num_sync_all_streams = d["num_sync_all_streams"].cast<int64_t>();
  s.num_device_alloc = d["num_device_alloc"].cast<int64_t>();
  s.num_device_free = d["num_device_free"].cast<int64_t>();
  s.max_split_size = d["max_split_size"].cast<int64_t>();
  return s;
}

void call_account(const char* name, c10::DeviceIndex index) {
  TORCH_CHECK(memory_account != nullptr, "pjrt: memory account before the shim's install");
  py::gil_scoped_acquire gil;
  memory_account->attr(name)(int(index));
}

// PyTorch's device allocator for pjrt (torch.accelerator's memory calls reach it). The
// data pointers it hands out are handles (see above); the statistics and the resets are
// the Python memory account's, so that torch.accelerator and torch.pjrt agree. Streams:
// one queue per device, so recordStream has nothing to hold back.
struct PjrtAllocator final : c10::DeviceAllocator {
  std::atomic<uint64_t> next{kAlign};

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex index = current_device;
    uint64_t span = ((nbytes + kAlign - 1) / kAlign + 1) * kAlign;
    uint64_t offset = next.fetch_add(span);
    TORCH_CHECK(offset + span < (1ULL << kIndexShift), "pjrt: handle space exhausted");
    void* ptr = reinterpret_cast<void*>(
        (uint64_t(index + 1) << kIndexShift) | offset);
    return {ptr, ptr, &free_handle, c10::Device(kPjrt, index)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  // Allocator::clone's copy, which only a copy-on-write storage's first write calls
  // (torch._lazy_clone shares a storage until one side writes): the Python table gives the
  // fresh handle `dest` a copy of the buffer of `src` (storage/table.py's copy).
  void copy_data(void* dest, const void* src, std::size_t nbytes) const override {
    TORCH_CHECK(copy_callback != nullptr, "pjrt: a storage copy before PJRT started");
    py::gil_scoped_acquire gil;
    (*copy_callback)(reinterpret_cast<uintptr_t>(dest), reinterpret_cast<uintptr_t>(src),
                     nbytes);
  }

  bool initialized() override { return started.load(); }
  void emptyCache(c10::MempoolId_t) override {
    TORCH_CHECK(memory_account != nullptr, "pjrt: empty_cache before the shim's install");
    py::gil_scoped_acquire gil;
    memory_account->attr("empty_cache")();
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    return device_stats(check_index(index));
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    call_account("reset_accumulated", check_index(index));
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    call_account("reset_peak", check_index(index));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    index = check_index(index);
    TORCH_CHECK(memory_account != nullptr, "pjrt: memory info before the shim's install");
    py::gil_scoped_acquire gil;
    auto info = memory_account->attr("memory_info")(int(index)).cast<std::pair<int64_t, int64_t>>();
    return {size_t(info.first), size_t(info.second)};
  }
};

PjrtAllocator allocator;

// ------------------------------------------------------------ pinned memory
// Host memory PyTorch asks for as "pinned" (pin_memory(), DataLoader(pin_memory=True),
// DDP's reducer, which checks it got some): PJRT copies from any host memory, so this
// is the CPU allocator's memory, remembered so that is_pinned() says yes. It is also the
// device's host allocator (torch.accelerator.empty_host_cache()): it caches nothing, a
// block is freed when its tensor dies, so there is no cache to empty.
struct PinnedAllocator final : at::HostAllocator {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // start -> size
  at::HostStats stats;  // under mu

  static void release(void* ptr);

  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(nbytes ? nbytes : 1);
    {
      std::lock_guard<std::mutex> lock(mu);
      blocks[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
      for (auto* s : {&stats.allocations, &stats.active_requests}) s->increase(1);
      for (auto* s : {&stats.allocated_bytes, &stats.active_bytes}) s->increase(nbytes);
      ++stats.num_host_alloc;
    }
    return {ptr, ptr, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool contains(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mu);
    auto it = blocks.upper_bound(p);
    if (it == blocks.begin()) return false;
    --it;
    return p < it->first + std::max<size_t>(it->second, 1);
  }

  // A block is freed when its tensor dies, whatever stream used it: one queue per
  // device, and PJRT's host-to-device copies have read the block when they return.
  bool record_event(void* ptr, void*, c10::Stream) override { return contains(ptr); }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    for (auto* s : {&stats.allocations, &stats.active_requests, &stats.allocated_bytes,
                    &stats.active_bytes})
      s->reset_accumulated();
    stats.num_host_alloc = stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    for (auto* s : {&stats.allocations, &stats.active_requests, &stats.allocated_bytes,
                    &stats.active_bytes})
      s->reset_peak();
  }
};

PinnedAllocator pinned;

void PinnedAllocator::release(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(pinned.mu);
    auto it = pinned.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != pinned.blocks.end()) {
      for (auto* s : {&pinned.stats.allocations, &pinned.stats.active_requests}) s->decrease(1);
      for (auto* s : {&pinned.stats.allocated_bytes, &pinned.stats.active_bytes})
        s->decrease(it->second);
      ++pinned.stats.num_host_free;
      pinned.blocks.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

c10::DeviceIndex index_from_ptr(const void* ptr) {
  auto bits = reinterpret_cast<uint64_t>(ptr) >> kIndexShift;
  return bits == 0 ? current_device : c10::DeviceIndex(bits - 1);
}

// ---------------------------------------------------------------- generator
// A counter-based generator like CUDA's Philox one: a seed and an offset that
// each random op advances. Python turns (seed, offset) into a JAX key.
struct PjrtGenerator final : c10::GeneratorImpl {
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;

  explicit PjrtGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kPjrt, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override { seed_ = seed; offset_ = 0; }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);  // a CPU byte tensor (a pjrt one has no host data)
    TORCH_CHECK(state.numel() == 16 && state.dtype().itemsize() == 1,
                "pjrt: RNG state must be a 16-byte uint8 tensor (seed, offset), got ",
                state.numel(), " elements");
    const auto* data = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, data, 8);
    std::memcpy(&offset_, data + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt,
                                       std::nullopt, std::nullopt, std::nullopt);
    auto* data = static_cast<uint8_t*>(state.mutable_data_ptr());
    std::memcpy(data, &seed_, 8);
    std::memcpy(data + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  PjrtGenerator* clone_impl() const override {
    auto* gen = new PjrtGenerator(device().index());
    gen->seed_ = seed_;
    gen->offset_ = offset_;
    return gen;
  }
};

std::deque<at::Generator>& default_generators() {
  static std::deque<at::Generator> gens;
  static std::once_flag once;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i)
      gens.emplace_back(at::make_generator<PjrtGenerator>(i));
  });
  return gens;
}

// ------------------------------------------------------------- device guard
struct PjrtEvent {
  c10::DeviceIndex device = 0;
  bool timed = false;
  int64_t ns = 0;  // steady clock, when a timed event's work was done
};

struct PjrtGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kPjrt; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current_device;
    if (d.index() >= 0) current_device = check_index(d.index());
    return c10::Device(kPjrt, old);
  }
  c10::Device getDevice() const override { return c10::Device(kPjrt, current_device); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) current_device = check_index(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kPjrt, check_index(d.index())));
  }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return count_without_starting(); }
  // torch.accelerator.get_device_capability(): the dtypes a pjrt tensor can have (the
  // storage layer sets them when PJRT starts, which asking the device count does).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    device_count();  // (starting PJRT sets the dtypes)
    check_index(d.index());
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = dtype_bits.load();
    return cap;
  }
  // Events: one PJRT device runs its work in order, so an event is the device it was
  // recorded on, and waiting for it waits for the device. An event with timing
  // (enable_timing=True) waits where it is recorded, for the work queued before it, and
  // keeps the time then: elapsed_time is the time between two such points.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    auto* e = static_cast<PjrtEvent*>(*event);
    if (e == nullptr) *event = e = new PjrtEvent();
    e->device = stream.device_index();
    e->timed = flag == c10::EventFlag::BACKEND_DEFAULT;
    if (e->timed) {
      call_sync(e->device);
      e->ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch()).count();
    }
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    if (event) call_sync(static_cast<PjrtEvent*>(event)->device);
    return true;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<PjrtEvent*>(event);
  }
  void synchronizeEvent(void* event) const override {
    if (event) call_sync(static_cast<PjrtEvent*>(event)->device);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<PjrtEvent*>(start);
    auto* b = static_cast<PjrtEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->timed && b->timed,
                "pjrt: elapsed_time needs two events recorded with enable_timing=True");
    return double(b->ns - a->ns) / 1e6;
  }
  bool queryStream(const c10::Stream& stream) const override {
    call_sync(stream.device_index());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    call_sync(stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    call_sync(index < 0 ? current_device : index);
  }
};

// -------------------------------------------------------------------- hooks
struct PjrtHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count_without_starting() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return count_without_starting(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { current_device = check_index(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device;
    current_device = check_index(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generators().at(check_index(index));
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<PjrtGenerator>(check_index(index));
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return c10::Device(kPjrt, index_from_ptr(data));
  }
  bool isPinnedPtr(const void* ptr) const override { return pinned.contains(ptr); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned; }
  // untyped_storage().resize_(n) (FSDP2 frees and re-allocates its unsharded parameters
  // so): a storage that grows gets a new handle, as a CPU storage gets new memory;
  // Python moves the buffer's record to it, keeping the first min(old, new) bytes.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    TORCH_CHECK(resize_callback != nullptr, "pjrt: a storage resize before PJRT started");
    auto* impl = storage.unsafeGetStorageImpl();
    void* old_ptr = impl->data_ptr().get();
    c10::DataPtr fresh;
    void* new_ptr = old_ptr;
    if (nbytes > impl->nbytes()) {
      c10::DeviceIndex saved = current_device;
      current_device = index_from_ptr(old_ptr);
      fresh = allocator.allocate(nbytes);
      current_device = saved;
      new_ptr = fresh.get();
    }
    {
      py::gil_scoped_acquire gil;
      (*resize_callback)(reinterpret_cast<uintptr_t>(old_ptr),
                         reinterpret_cast<uintptr_t>(new_ptr), nbytes);
    }
    if (new_ptr != old_ptr) impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(nbytes);
  }
};

PjrtHooks hooks;
PjrtGuard guard;

// ------------------------------------------------ shallow-copy compatibility
// `param.data = t` and Module._apply (`.to`, `.half()`, `to_empty`) keep a tensor's
// identity only where PyTorch deems the two tensors' types shallow-copy compatible;
// otherwise a module gets a new Parameter per module, and tied weights come apart.
// TensorImpl's own rule knows the in-tree dense backends (CPU, CUDA, ...) and leaves
// PrivateUse1 to this op: a dense pjrt tensor is compatible with any dense tensor of
// those backends, as a CUDA tensor is with a CPU one.
bool is_dense(c10::DispatchKeySet ks) {
  using c10::BackendComponent;
  constexpr auto backends = c10::DispatchKeySet(
      {BackendComponent::CPUBit, BackendComponent::CUDABit, BackendComponent::MPSBit,
       BackendComponent::HIPBit, BackendComponent::XPUBit, BackendComponent::HPUBit,
       BackendComponent::MTIABit, BackendComponent::PrivateUse1Bit});
  return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return (is_dense(self.key_set()) && is_dense(from.key_set())) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// ------------------------------------------------------------ python entry
void install(py::object count_fn, py::object known_count_fn, py::object free_fn,
             py::object sync_fn, py::object memory) {
  count_callback = new py::object(std::move(count_fn));
  known_count_callback = new py::object(std::move(known_count_fn));
  free_callback = new py::object(std::move(free_fn));
  sync_callback = new py::object(std::move(sync_fn));
  memory_account = new py::object(std::move(memory));
  c10::SetAllocator(kPjrt, &allocator, /*priority=*/100);
  at::setHostAllocator(kPjrt, &pinned, /*priority=*/100);
  c10::impl::registerDeviceGuard(kPjrt, &guard);
  at::RegisterPrivateUse1HooksInterface(&hooks);
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

at::Tensor empty_strided(const std::vector<int64_t>& size,
                         const std::vector<int64_t>& stride,
                         c10::ScalarType dtype, int index) {
  return torch_pjrt::empty_pjrt(size, stride, dtype, index);
}

// The dtypes the device takes, as DeviceCapability's bits (one per dtype of
// AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS; a dtype without a bit is left out).
void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes) {
  uint64_t bits = 0;
  for (auto t : dtypes) {
#define PJRT_DTYPE_BIT(_, name) \
    if (t == c10::ScalarType::name) bits |= uint64_t(1) << c10::kIndex_##name;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(PJRT_DTYPE_BIT)
#undef PJRT_DTYPE_BIT
  }
  dtype_bits.store(bits);
}

// (seed, offset) for a random op that draws `increment` keys, advancing the
// generator. `gen` is None for the device's default generator.
std::pair<uint64_t, uint64_t> philox_next(std::optional<at::Generator> gen, int index,
                                          uint64_t increment) {
  at::Generator g = gen.has_value() ? *gen : default_generators().at(check_index(index));
  std::lock_guard<std::mutex> lock(g.mutex());
  auto* impl = g.get<PjrtGenerator>();
  TORCH_CHECK(impl != nullptr && g.device().type() == kPjrt,
              "pjrt: expected a pjrt generator, got one on ", g.device());
  auto out = std::make_pair(impl->seed_, impl->offset_);
  impl->offset_ += increment;
  return out;
}

// ------------------------------------------------------ metadata-only ops
// Views and other metadata-only ops run PyTorch's CPU kernel, which reads no
// data, over the pjrt storage. This is done here rather than in Python because
// a tensor returned by a Python kernel is already bound to a Python object,
// which C++ callers such as nn.Parameter's detach() cannot rebind.
void cpu_metadata_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                         torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

void register_metadata_ops(const std::vector<std::string>& names) {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& name : names) {
    lib->impl(name.c_str(),
              torch::CppFunction::makeFromBoxedFunction<&cpu_metadata_kernel>());
  }
}

// ------------------------------------------------------------------ SDPA
// PyTorch asks each backend which fused attention kernel to use; a PrivateUse1
// backend can only answer from C++. The "overrideable" kernel is the lowered
// one (dense or chunked online softmax); math stays available if it is turned off.
// A script written for CUDA that asks for flash, memory-efficient or cuDNN attention
// (torch.nn.attention.sdpa_kernel) gets the lowered kernel: it is the fused one here.
int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>&, double, bool, std::optional<double>, bool) {
  auto& ctx = at::globalContext();
  bool batched = q.dim() == 4 && k.dim() == 4 && v.dim() == 4;  // what the fused op takes
  bool fused = ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
               ctx.userEnabledMemEfficientSDP() || ctx.userEnabledCuDNNSDP();
  if (batched && fused) return int64_t(at::SDPBackend::overrideable);
  if (ctx.userEnabledMathSDP()) return int64_t(at::SDPBackend::math);
  return int64_t(at::SDPBackend::error);
}

}  // namespace

at::Tensor torch_pjrt::empty_pjrt(c10::IntArrayRef size, c10::IntArrayRef stride,
                                  c10::ScalarType dtype, int index) {
  c10::DeviceIndex old = current_device;
  current_device = check_index(c10::DeviceIndex(index));
  try {
    auto t = at::detail::empty_strided_generic(
        size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
    current_device = old;
    return t;
  } catch (...) {
    current_device = old;
    throw;
  }
}

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &sdp_choice)
}  // namespace at::native

// ---------------------------------------------------------------- threads
namespace {
std::recursive_mutex ops_mutex;
}  // namespace

void torch_pjrt::lock_ops() {
  if (ops_mutex.try_lock()) return;
  if (PyGILState_Check()) {  // the thread holding the lock may need the GIL to finish
    py::gil_scoped_release no_gil;
    ops_mutex.lock();
  } else {
    ops_mutex.lock();
  }
}

void torch_pjrt::unlock_ops() { ops_mutex.unlock(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("lock_ops", &torch_pjrt::lock_ops);
  m.def("unlock_ops", &torch_pjrt::unlock_ops);
  m.def("empty_strided", &empty_strided);
  m.def("set_free_callback", [](py::object fn) { free_callback = new py::object(std::move(fn)); });
  m.def("set_resize_callback",
        [](py::object fn) { resize_callback = new py::object(std::move(fn)); });
  m.def("set_copy_callback",
        [](py::object fn) { copy_callback = new py::object(std::move(fn)); });
  m.def("philox_next", &philox_next);
  m.def("register_metadata_ops", &register_metadata_ops);
  m.def("default_generator", [](int i) { return default_generators().at(check_index(c10::DeviceIndex(i))); });
  m.def("current_device", [] { return int(current_device); });
  m.def("set_device", [](int i) { current_device = check_index(c10::DeviceIndex(i)); });
  m.def("set_default_device", [](int i) {
    default_device.store(i);
    current_device = c10::DeviceIndex(i);
  });
  m.def("device_from_ptr", [](uint64_t p) { return int(index_from_ptr(reinterpret_cast<void*>(p))); });
  m.def("shutdown", [] { shutting_down = true; });
  // PJRT has started with `count` devices; returns the count given out before (-1: none).
  m.def("mark_started", [](int count) {
    known_device_count.store(count);
    started.store(true);
    return predicted_count.load();
  });
  m.def("set_supported_dtypes", [](const std::vector<py::object>& dtypes) {
    std::vector<c10::ScalarType> types;
    for (const auto& d : dtypes) {
      TORCH_CHECK(THPDtype_Check(d.ptr()), "pjrt: set_supported_dtypes takes torch dtypes");
      types.push_back(reinterpret_cast<THPDtype*>(d.ptr())->scalar_type);
    }
    set_supported_dtypes(types);
  });
  m.def("cpu_kernels", [] {  // cpu_kernels.cpp: {XLA FFI target: handler}, empty without MKL
    py::dict out;
    for (auto& [name, handler] : torch_pjrt_cpu_kernels())
      out[name] = py::capsule(handler, "xla._CUSTOM_CALL_TARGET");
    return out;
  });
  torch_pjrt::add_op_kernel(m);
  torch_pjrt::add_profiler(m);
}
