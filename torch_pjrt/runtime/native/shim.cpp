// torch-pjrt native shim: the runtime hooks that PyTorch does not forward to
// Python (device index, device guard, synchronize, generators, allocator).
// Everything else in torch-pjrt is Python; this file only connects PyTorch's
// C++ hook points to Python callbacks.

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

namespace py = pybind11;

std::vector<std::pair<const char*, void*>> torch_pjrt_cpu_kernels();  // cpu_kernels.cpp

namespace {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;

thread_local c10::DeviceIndex current_device = 0;
std::atomic<int> known_device_count{-1};
bool shutting_down = false;

// Python callbacks, set once by torch_pjrt.runtime. Leaked on purpose: they
// must outlive every tensor, including those freed during interpreter exit.
py::object* free_callback = nullptr;   // free(ptr: int) -> None
py::object* sync_callback = nullptr;   // synchronize(device_index: int) -> None
py::object* count_callback = nullptr;  // device_count() -> int (starts the PJRT client)

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

c10::DeviceIndex check_index(c10::DeviceIndex index) {
  if (index < 0) return current_device;
  auto count = device_count();
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

struct PjrtAllocator final : c10::Allocator {
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

  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "pjrt: device memory cannot be copied by the host allocator");
  }
};

PjrtAllocator allocator;

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
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  // Events: one PJRT device runs its work in order, so an event is the
  // device index it was recorded on, and waiting for it waits for the device.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    *event = reinterpret_cast<void*>(intptr_t(stream.device_index()) + 1);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    if (event) call_sync(c10::DeviceIndex(reinterpret_cast<intptr_t>(event) - 1));
    return true;
  }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeEvent(void* event) const override {
    if (event) call_sync(c10::DeviceIndex(reinterpret_cast<intptr_t>(event) - 1));
  }
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override {
    TORCH_CHECK(false, "pjrt: event timing is not supported; use torch.profiler");
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
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
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
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetAllocator(c10::DeviceType::CPU);
  }
  void resizePrivateUse1Bytes(const c10::Storage&, size_t) const override {
    TORCH_CHECK(false, "pjrt: storages are resized by torch_pjrt, not in place");
  }
};

PjrtHooks hooks;
PjrtGuard guard;

// ------------------------------------------------------------ python entry
void install(py::object count_fn, py::object free_fn, py::object sync_fn) {
  count_callback = new py::object(std::move(count_fn));
  free_callback = new py::object(std::move(free_fn));
  sync_callback = new py::object(std::move(sync_fn));
  c10::SetAllocator(kPjrt, &allocator, /*priority=*/100);
  c10::impl::registerDeviceGuard(kPjrt, &guard);
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

at::Tensor empty_strided(const std::vector<int64_t>& size,
                         const std::vector<int64_t>& stride,
                         c10::ScalarType dtype, int index) {
  c10::DeviceIndex old = current_device;
  current_device = check_index(c10::DeviceIndex(index));
  auto t = at::detail::empty_strided_generic(
      size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  current_device = old;
  return t;
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
int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>&, double, bool, std::optional<double>, bool) {
  auto& ctx = at::globalContext();
  bool batched = q.dim() == 4 && k.dim() == 4 && v.dim() == 4;  // what the fused op takes
  if (batched && ctx.userEnabledOverrideableSDP()) return int64_t(at::SDPBackend::overrideable);
  if (ctx.userEnabledMathSDP()) return int64_t(at::SDPBackend::math);
  return int64_t(at::SDPBackend::error);
}

// ------------------------------------------------------------ op cache key
// The executor's hit path: the cache key of a call built from the arguments'
// metadata (what eager/executor.py's _key reads, packed into bytes), looked up
// in the op cache. lookup(plan, args, records, cache) returns
//   (entry, recs, dyn, device, values)  on a hit: the storage records in
//                               argument order, the run-time numbers, the device,
//                               the records' values;
//   (None, key)                 on a miss: the key to file the entry under;
//   None                        when the call needs the executor's Python key
//                               (an argument kind or value this does not cover).
// plan = (token, codes, defaults, min_args): one code per schema argument.
enum ArgCode : long { kTensor = 0, kOptTensor = 1, kTensorList = 2, kStatic = 3,
                      kScalar = 4, kOther = 5 };

PyObject* s_numel = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_value = nullptr;
PyObject* s_device = nullptr;
std::vector<PyObject*> dtype_codes;  // storage dtypes seen (strong references)

struct KeyBuilder {
  std::vector<int64_t> sig;
  std::vector<uintptr_t> ptrs;
  PyObject* records;  // borrowed: the storage table
  PyObject* recs;     // new list
  PyObject* dyn;      // new list
  PyObject* extras;   // new list: values that are part of the key as objects
  long device = -1;
  bool busy = false;

  // A storage attribute that is a small int; false on anything else.
  static bool int_attr(PyObject* rec, PyObject* name, int64_t* out) {
    PyObject* v = PyObject_GetAttr(rec, name);
    if (v == nullptr) return false;
    int overflow = 0;
    *out = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : -1;
    bool ok = PyLong_Check(v) && !overflow && !PyErr_Occurred();
    Py_DECREF(v);
    return ok;
  }

  static int64_t dtype_code(PyObject* dtype) {
    for (size_t i = 0; i < dtype_codes.size(); ++i)
      if (dtype_codes[i] == dtype) return int64_t(i);
    if (dtype_codes.size() >= 256) return -1;
    Py_INCREF(dtype);
    dtype_codes.push_back(dtype);
    return int64_t(dtype_codes.size() - 1);
  }

  bool number(PyObject* o) {
    PyTypeObject* tp = Py_TYPE(o);
    int64_t code;
    if (tp == &PyFloat_Type) code = -1;
    else if (tp == &PyLong_Type) code = -2;
    else if (tp == &PyBool_Type) code = -3;
    else if (tp == &PyComplex_Type) code = -4;
    else return false;
    sig.push_back(code);
    return PyList_Append(dyn, o) == 0;
  }

  bool tensor(PyObject* o) {
    if (!THPVariable_Check(o)) return number(o);
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.device().type() != kPjrt || !t.has_storage() || t.is_sparse()) return false;
    uintptr_t ptr = reinterpret_cast<uintptr_t>(t.storage().data());
    size_t idx = 0;
    while (idx < ptrs.size() && ptrs[idx] != ptr) ++idx;
    PyObject* rec;
    if (idx == ptrs.size()) {
      PyObject* key = PyLong_FromSize_t(ptr);
      if (key == nullptr) return false;
      rec = PyDict_GetItemWithError(records, key);  // borrowed
      Py_DECREF(key);
      if (rec == nullptr) return false;
      int64_t dev;
      if (!int_attr(rec, s_device, &dev)) return false;
      if (device < 0) device = long(dev);
      else if (dev != device) return false;
      ptrs.push_back(ptr);
      if (PyList_Append(recs, rec) != 0) return false;
    } else {
      rec = PyList_GET_ITEM(recs, idx);
    }
    int64_t numel;
    if (!int_attr(rec, s_numel, &numel)) return false;
    PyObject* dtype = PyObject_GetAttr(rec, s_dtype);
    if (dtype == nullptr) return false;
    int64_t code = dtype_code(dtype);
    Py_DECREF(dtype);
    if (code < 0) return false;
    PyObject* value = PyObject_GetAttr(rec, s_value);
    if (value == nullptr) return false;
    bool uninit = value == Py_None;
    Py_DECREF(value);
    auto sizes = t.sizes();
    auto strides = t.strides();
    int64_t n = int64_t(sizes.size());
    sig.push_back(int64_t(idx));
    sig.push_back(int64_t(t.scalar_type()));
    sig.push_back(n);
    sig.insert(sig.end(), sizes.begin(), sizes.end());
    sig.insert(sig.end(), strides.begin(), strides.end());
    sig.push_back(t.storage_offset());
    sig.push_back(numel);
    sig.push_back(code);
    sig.push_back(int64_t(uninit) | int64_t(t.is_conj()) << 1 | int64_t(t.is_neg()) << 2);
    return true;
  }

  bool tensor_list(PyObject* o) {
    if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    sig.push_back(-20);
    sig.push_back(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (items[i] == Py_None) sig.push_back(-10);
      else if (!tensor(items[i])) return false;
    }
    return true;
  }

  // A value that is part of the key as itself (lists as tuples), as _hashable does.
  bool other(PyObject* o) {
    if (PyList_Check(o)) {
      Py_ssize_t n = PyList_GET_SIZE(o);
      PyObject* tup = PyTuple_New(n);
      if (tup == nullptr) return false;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* x = PyList_GET_ITEM(o, i);
        if (PyList_Check(x) || THPDevice_Check(x) || THPVariable_Check(x)) {
          Py_DECREF(tup);
          return false;
        }
        Py_INCREF(x);
        PyTuple_SET_ITEM(tup, i, x);
      }
      bool ok = PyObject_Hash(tup) != -1 && PyList_Append(extras, tup) == 0;
      Py_DECREF(tup);
      return ok;
    }
    if (THPDevice_Check(o) || THPVariable_Check(o)) return false;
    return PyObject_Hash(o) != -1 && PyList_Append(extras, o) == 0;
  }
};

PyObject* lookup(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 4 || !PyTuple_Check(argv[0]) || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "lookup(plan, args, records, cache)");
    return nullptr;
  }
  PyObject* plan = argv[0];
  PyObject* args = argv[1];
  PyObject* codes = PyTuple_GET_ITEM(plan, 1);
  PyObject* defaults = PyTuple_GET_ITEM(plan, 2);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs < PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 3)) ||
      nargs > PyTuple_GET_SIZE(codes))
    Py_RETURN_NONE;
  thread_local KeyBuilder kb;
  if (kb.busy) Py_RETURN_NONE;  // re-entered from a __hash__ or __eq__ of an argument
  kb.busy = true;
  kb.sig.clear();
  kb.ptrs.clear();
  kb.device = -1;
  kb.records = argv[2];
  kb.recs = PyList_New(0);
  kb.dyn = PyList_New(0);
  kb.extras = PyList_New(0);
  PyObject* result = nullptr;
  bool ok = kb.recs && kb.dyn && kb.extras;
  try {
    for (Py_ssize_t i = 0; ok && i < nargs; ++i) {
      PyObject* v = PyTuple_GET_ITEM(args, i);
      switch (PyLong_AsLong(PyTuple_GET_ITEM(codes, i))) {
        case kTensor:
          ok = kb.tensor(v);
          break;
        case kOptTensor:
          if (v == Py_None) kb.sig.push_back(-10);
          else ok = kb.tensor(v);
          break;
        case kTensorList:
          ok = kb.tensor_list(v);
          break;
        case kStatic:
          ok = PyObject_Hash(v) != -1 && PyList_Append(kb.extras, v) == 0;
          break;
        case kScalar: {  // the default by value, else a run-time number by type
          PyObject* d = PyTuple_GET_ITEM(defaults, i);
          int eq = Py_TYPE(v) == Py_TYPE(d) ? PyObject_RichCompareBool(v, d, Py_EQ) : 0;
          if (eq < 0) ok = false;
          else if (eq) ok = PyList_Append(kb.extras, v) == 0;
          else ok = PyList_Append(kb.extras, reinterpret_cast<PyObject*>(Py_TYPE(v))) == 0 &&
                    PyList_Append(kb.dyn, v) == 0;
          break;
        }
        case kOther:
          ok = kb.other(v);
          break;
        default:
          ok = false;
      }
    }
  } catch (const std::exception&) {
    ok = false;
  }
  if (ok && kb.device >= 0) {
    Py_ssize_t n_extras = PyList_GET_SIZE(kb.extras);
    PyObject* key = PyTuple_New(4 + n_extras);
    if (key != nullptr) {
      Py_INCREF(PyTuple_GET_ITEM(plan, 0));
      PyTuple_SET_ITEM(key, 0, PyTuple_GET_ITEM(plan, 0));
      PyTuple_SET_ITEM(key, 1, PyLong_FromSsize_t(nargs));
      PyTuple_SET_ITEM(key, 2, PyLong_FromLong(kb.device));
      PyTuple_SET_ITEM(key, 3, PyBytes_FromStringAndSize(
          reinterpret_cast<const char*>(kb.sig.data()), Py_ssize_t(kb.sig.size() * 8)));
      for (Py_ssize_t i = 0; i < n_extras; ++i) {
        PyObject* x = PyList_GET_ITEM(kb.extras, i);
        Py_INCREF(x);
        PyTuple_SET_ITEM(key, 4 + i, x);
      }
      PyObject* entry = PyDict_GetItemWithError(argv[3], key);  // borrowed
      if (entry != nullptr) {
        Py_ssize_t n_recs = PyList_GET_SIZE(kb.recs);
        PyObject* values = PyTuple_New(n_recs);
        for (Py_ssize_t i = 0; values != nullptr && i < n_recs; ++i) {
          PyObject* v = PyObject_GetAttr(PyList_GET_ITEM(kb.recs, i), s_value);
          if (v == nullptr) Py_CLEAR(values);
          else PyTuple_SET_ITEM(values, i, v);
        }
        if (values != nullptr) {
          result = PyTuple_Pack(5, entry, kb.recs, kb.dyn, PyTuple_GET_ITEM(key, 2), values);
          Py_DECREF(values);
        }
      } else if (!PyErr_Occurred()) {
        result = PyTuple_Pack(2, Py_None, key);
      }
      Py_DECREF(key);
    }
  }
  Py_XDECREF(kb.recs);
  Py_XDECREF(kb.dyn);
  Py_XDECREF(kb.extras);
  kb.busy = false;
  if (result == nullptr) {
    PyErr_Clear();  // the Python key handles it (and raises its errors)
    Py_RETURN_NONE;
  }
  return result;
}

// new_tensor(shape, stride, dtype, device, record, records): a tensor on a new storage,
// filed in the storage table under its handle. empty_strided for the executor's outputs.
bool int_tuple(PyObject* o, c10::SmallVector<int64_t, 8>& out) {
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  for (Py_ssize_t i = 0; i < n; ++i) {
    int64_t v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) return false;
    out.push_back(v);
  }
  return true;
}

PyObject* new_tensor(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  c10::SmallVector<int64_t, 8> size, stride;
  TORCH_CHECK_TYPE(argc == 6 && int_tuple(argv[0], size) && int_tuple(argv[1], stride) &&
                       THPDtype_Check(argv[2]) && PyLong_Check(argv[3]) && PyDict_Check(argv[5]),
                   "new_tensor(shape, stride, dtype, device: int, record, records)");
  auto dtype = reinterpret_cast<THPDtype*>(argv[2])->scalar_type;
  auto index = c10::DeviceIndex(PyLong_AsLong(argv[3]));
  c10::DeviceIndex old = current_device;
  current_device = check_index(index);
  at::Tensor t;
  try {
    t = at::detail::empty_strided_generic(
        size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  } catch (...) {
    current_device = old;
    throw;
  }
  current_device = old;
  PyObject* key = PyLong_FromSize_t(reinterpret_cast<uintptr_t>(t.storage().data()));
  if (key == nullptr) return nullptr;
  int err = PyDict_SetItem(argv[5], key, argv[4]);
  Py_DECREF(key);
  if (err != 0) return nullptr;
  return THPVariable_Wrap(std::move(t));
  END_HANDLE_TH_ERRORS
}

PyMethodDef fast_methods[] = {
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&new_tensor)),
     METH_FASTCALL, "A tensor on a new storage, filed in the storage table (see shim.cpp)."},
    {"lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&lookup)), METH_FASTCALL,
     "The op cache entry of a call (see shim.cpp)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &sdp_choice)
}  // namespace at::native

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("empty_strided", &empty_strided);
  m.def("set_free_callback", [](py::object fn) { free_callback = new py::object(std::move(fn)); });
  m.def("philox_next", &philox_next);
  m.def("register_metadata_ops", &register_metadata_ops);
  m.def("default_generator", [](int i) { return default_generators().at(check_index(c10::DeviceIndex(i))); });
  m.def("current_device", [] { return int(current_device); });
  m.def("set_device", [](int i) { current_device = check_index(c10::DeviceIndex(i)); });
  m.def("device_from_ptr", [](uint64_t p) { return int(index_from_ptr(reinterpret_cast<void*>(p))); });
  m.def("shutdown", [] { shutting_down = true; });
  m.def("cpu_kernels", [] {  // cpu_kernels.cpp: {XLA FFI target: handler}, empty without MKL
    py::dict out;
    for (auto& [name, handler] : torch_pjrt_cpu_kernels())
      out[name] = py::capsule(handler, "xla._CUSTOM_CALL_TARGET");
    return out;
  });
  s_numel = PyUnicode_InternFromString("numel");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_value = PyUnicode_InternFromString("value");
  s_device = PyUnicode_InternFromString("device");
  if (PyModule_AddFunctions(m.ptr(), fast_methods) != 0) throw py::error_already_set();
}
