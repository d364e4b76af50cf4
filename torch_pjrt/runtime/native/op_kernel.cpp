// torch-pjrt's op hit path in C++: the op cache key of a call, and the PrivateUse1
// kernel of every lowered op. In fused mode a call whose signature is cached, of an op
// that returns one fresh tensor or the one argument it writes in place, is recorded
// into the pending graph here, without running Python code; every other call goes on
// to eager/executor.py (native_call), which owns the executor's logic, and an indexing
// call with a boolean mask to its op's Python kernel. The objects built here
// (graph.Node, graph.Lazy, table.StorageRecord) are the Python classes', their
// __slots__ filled directly.

#include <Python.h>
#include <structmember.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/COW.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <memory>
#include <tuple>
#include <vector>

#include "shim.h"

namespace py = pybind11;

namespace torch_pjrt {
namespace {

// ------------------------------------------------------------ slotted objects
// A Python class with __slots__: where each named slot lives in its instances.
struct Slots {
  PyTypeObject* type = nullptr;
  std::vector<Py_ssize_t> offset;

  void init(py::handle cls, std::initializer_list<const char*> names) {
    type = reinterpret_cast<PyTypeObject*>(cls.inc_ref().ptr());
    offset.clear();
    for (const char* name : names) {
      py::object d = cls.attr(name);
      TORCH_CHECK(Py_TYPE(d.ptr()) == &PyMemberDescr_Type, "pjrt: ", name,
                  " is not a __slots__ member of ", type->tp_name);
      offset.push_back(reinterpret_cast<PyMemberDescrObject*>(d.ptr())->d_member->offset);
    }
  }
  bool is(PyObject* o) const { return type != nullptr && Py_TYPE(o) == type; }
  // Borrowed; null where the slot is unset.
  PyObject* get(PyObject* o, int i) const {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset[size_t(i)]);
  }
  // Steals `v`.
  void put(PyObject* o, int i, PyObject* v) const {
    auto** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset[size_t(i)]);
    PyObject* old = *p;
    *p = v;
    Py_XDECREF(old);
  }
  // A new instance; `untracked`: one the cyclic GC does not see, for objects that are in
  // no cycle (see PendingNode).
  PyObject* make(bool untracked = false) const {
    PyObject* o = type->tp_alloc(type, 0);
    if (untracked && o != nullptr && PyObject_IS_GC(o)) PyObject_GC_UnTrack(o);
    return o;
  }
};

enum { kNodeEntry, kNodeInputs, kNodeDyn, kNodePosition };
enum { kLazyNode, kLazyIndex, kLazyShape, kLazyDtype };
enum { kRecValue, kRecDtype, kRecNumel, kRecNbytes, kRecDevice };
enum { kEntrySingle, kEntryAlone, kEntryOrdered, kEntryOrder, kEntryOuts, kEntryAvals,
       kEntryWritten, kEntryAliasReturn };
enum { kMemAllocated, kMemPeak, kMemAllocs, kMemSoftLimit, kMemFrees, kMemTotal, kMemLivePeak };

// What the kernel reads and writes of the Python side, set by configure().
struct State {
  PyObject* graph = nullptr;    // eager.graph's globals
  PyObject* modes = nullptr;    // eager.modes's globals
  PyObject* counts = nullptr;   // counters._counters
  PyObject* devices = nullptr;  // memory._devices
  PyObject* records = nullptr;  // table._records
  PyObject* cache = nullptr;    // op_cache.cache
  PyObject* call = nullptr;     // executor.native_call(spec, found, values)
  PyObject* flush_due = nullptr;  // graph.flush_due()
  Slots node, lazy, rec, entry, mem;
};
State S;
bool configured = false;
// Set while someone watches each recorded op (a profile, program dumps): fused hits are
// then recorded by Python, which notes the op's line of user code (runtime/watch.py).
bool python_records = false;

PyObject* s_numel = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_value = nullptr;
PyObject* s_device = nullptr;
PyObject* s_fused = nullptr;
PyObject* s_debug = nullptr;
PyObject* s_nodes = nullptr;
PyObject* s_graph_device = nullptr;
PyObject* s_pending = nullptr;
PyObject* s_due = nullptr;
PyObject* s_max_ops = nullptr;
PyObject* s_cache_hits = nullptr;
PyObject* s_superseded = nullptr;
PyObject* s_task = nullptr;

// A storage record's attribute (new reference): its slot where it is a StorageRecord.
PyObject* rec_attr(PyObject* rec, int slot, PyObject* name) {
  if (S.rec.is(rec)) {
    PyObject* v = S.rec.get(rec, slot);
    if (v != nullptr) {
      Py_INCREF(v);
      return v;
    }
  }
  return PyObject_GetAttr(rec, name);
}

// ------------------------------------------------------------ op cache key
// The cache key of a call built from the arguments' metadata (what call_key.py's key_of
// reads, packed into bytes), looked up in the op cache:
//   (entry, recs, dyn, device, values)  on a hit: the storage records in argument
//                               order, the run-time numbers, the device, the
//                               records' values;
//   (None, key)                 on a miss: the key to file the entry under;
//   None                        when the call needs the executor's Python key
//                               (an argument kind or value this does not cover).
// plan = (token, codes, defaults, min_args): one code per schema argument. The key
// of a call from Python (lookup) and that of a call from the dispatcher (the kernel,
// every argument present) differ in their argument count's sign, so each finds the
// entries filed under its own.
enum ArgCode : long { kTensor = 0, kOptTensor = 1, kTensorList = 2, kStatic = 3,
                      kScalar = 4, kOther = 5, kNone = 6, kWrittenTensor = 7,
                      kWrittenTensorList = 8 };
// In a tensor's offset place in the key: its offset is among the run-time values.
constexpr int64_t kDynamicOffset = -30;

std::vector<PyObject*> dtype_codes;  // storage dtypes seen (strong references)

struct KeyBuilder {
  std::vector<int64_t> sig;
  std::vector<uintptr_t> ptrs;
  PyObject* records = nullptr;  // borrowed: the storage table
  PyObject* recs = nullptr;     // new list
  PyObject* dyn = nullptr;      // new list
  PyObject* extras = nullptr;   // new list: values that are part of the key as objects
  long device = -1;
  bool busy = false;

  // A storage attribute that is a small int; false on anything else.
  static bool int_attr(PyObject* rec, int slot, PyObject* name, int64_t* out) {
    PyObject* v = rec_attr(rec, slot, name);
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

  // call_key.dynamic_offset's twin: a read view whose offset is a run-time value (a
  // nonzero offset of a non-empty view, contiguous or strided, read or written).
  static bool dynamic_offset(const at::Tensor& t) {
    if (t.storage_offset() <= 0) return false;
    for (int64_t n : t.sizes())
      if (n == 0) return false;
    return true;
  }

  // `written`: the op writes this argument (its offset stays in the key).
  bool tensor(const at::Tensor& t, bool written = false) {
    if (!t.defined() || t.device().type() != kPjrt || !t.has_storage() || t.is_sparse())
      return false;
    // A copy-on-write storage (torch._lazy_clone) is read through the buffer it shares
    // (the const pointer), as the CPU does; a write gives it its own handle and buffer
    // first, as the Python path's storage_ptr does: a write through the shared handle
    // would reach both tensors.
    const c10::Storage& storage = t.storage();
    if (written &&
        c10::impl::cow::is_cow_data_ptr(std::as_const(*storage.unsafeGetStorageImpl()).data_ptr()))
      storage.mutable_data();  // PyTorch's materialization: the allocator's copy_data
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
      if (!int_attr(rec, kRecDevice, s_device, &dev)) return false;
      if (device < 0) device = long(dev);
      else if (dev != device) return false;
      ptrs.push_back(ptr);
      if (PyList_Append(recs, rec) != 0) return false;
    } else {
      rec = PyList_GET_ITEM(recs, idx);
    }
    int64_t numel;
    if (!int_attr(rec, kRecNumel, s_numel, &numel)) return false;
    PyObject* dtype = rec_attr(rec, kRecDtype, s_dtype);
    if (dtype == nullptr) return false;
    int64_t code = dtype_code(dtype);
    Py_DECREF(dtype);
    if (code < 0) return false;
    PyObject* value = rec_attr(rec, kRecValue, s_value);
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
    if (dynamic_offset(t)) {
      sig.push_back(kDynamicOffset);
      PyObject* offset = PyLong_FromLongLong(t.storage_offset());
      if (offset == nullptr) return false;
      bool ok = PyList_Append(dyn, offset) == 0;
      Py_DECREF(offset);
      if (!ok) return false;
    } else {
      sig.push_back(t.storage_offset());
    }
    sig.push_back(numel);
    sig.push_back(code);
    sig.push_back(int64_t(uninit) | int64_t(t.is_conj()) << 1 | int64_t(t.is_neg()) << 2);
    return true;
  }

  // A Python argument where the schema has a Tensor: a pjrt tensor, else a number.
  bool tensor(PyObject* o, bool written = false) {
    if (!THPVariable_Check(o)) return number(o);
    return tensor(THPVariable_Unpack(o), written);
  }

  bool tensor_list(PyObject* o, bool written = false) {
    if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    sig.push_back(-20);
    sig.push_back(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (items[i] == Py_None) sig.push_back(-10);
      else if (!tensor(items[i], written)) return false;
    }
    return true;
  }

  bool tensor_list(const c10::IValue& v, bool written = false) {
    if (v.isTensorList()) {
      auto list = v.toTensorList();
      sig.push_back(-20);
      sig.push_back(int64_t(list.size()));
      for (const at::Tensor& t : list)
        if (!tensor(t, written)) return false;
      return true;
    }
    if (!v.isList()) return false;
    auto list = v.toListRef();
    sig.push_back(-20);
    sig.push_back(int64_t(list.size()));
    for (const c10::IValue& x : list) {
      if (x.isNone()) sig.push_back(-10);
      else if (!x.isTensor() || !tensor(x.toTensor(), written)) return false;
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

  // scalars.range_of's twin: the range of RANGE_BOUNDS (the same bounds, as doubles) a
  // run-time int or float falls in; false where the Python path decides (an int past
  // 2^53, which a double does not hold exactly).
  static bool number_range(PyObject* v, long* out) {
    static const double bounds[] = {
        -3.4028234663852886e+38, -3.3895313892515355e+38, -9.223372036854776e+18,
        -2147483648.0, -65504.0, -32768.0, -128.0, 0.0, 127.0, 255.0, 32767.0, 65504.0,
        65535.0, 2147483647.0, 4294967295.0, 9.223372036854776e+18, 1.8446744073709552e+19,
        3.3895313892515355e+38, 3.4028234663852886e+38};
    double x;
    if (PyFloat_CheckExact(v)) {
      x = PyFloat_AS_DOUBLE(v);
      if (std::isnan(x)) { *out = -1; return true; }
      if (std::isinf(x)) { *out = x > 0 ? -2 : -3; return true; }
    } else if (PyLong_CheckExact(v)) {
      int overflow = 0;
      long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow || i > (1LL << 53) || i < -(1LL << 53)) return false;
      x = double(i);
    } else {
      *out = 0;
      return true;
    }
    const double* end = bounds + sizeof(bounds) / sizeof(bounds[0]);
    const double* at = std::lower_bound(bounds, end, x);
    *out = 2 * long(at - bounds) + (at != end && *at == x);
    return true;
  }

  // A Scalar argument: the default by value, else a run-time number by type and range
  // (past int64, uint64's upper half, call_key types it np.uint64: the Python path).
  bool scalar(PyObject* v, PyObject* d) {
    int eq = Py_TYPE(v) == Py_TYPE(d) ? PyObject_RichCompareBool(v, d, Py_EQ) : 0;
    if (eq < 0) return false;
    if (eq) return PyList_Append(extras, v) == 0;
    long range;
    if (!number_range(v, &range)) return false;
    PyObject* r = PyLong_FromLong(range);
    if (r == nullptr) return false;
    bool ok = PyList_Append(extras, reinterpret_cast<PyObject*>(Py_TYPE(v))) == 0 &&
              PyList_Append(extras, r) == 0 && PyList_Append(dyn, v) == 0;
    Py_DECREF(r);
    return ok;
  }

  // A static argument: by value, its type alongside (1, 1.0 and True hash alike).
  bool fixed(PyObject* v) {
    return PyObject_Hash(v) != -1 && PyList_Append(extras, v) == 0 &&
           PyList_Append(extras, reinterpret_cast<PyObject*>(Py_TYPE(v))) == 0;
  }

  bool start(PyObject* table) {
    sig.clear();
    ptrs.clear();
    device = -1;
    records = table;
    recs = PyList_New(0);
    dyn = PyList_New(0);
    extras = PyList_New(0);
    return recs && dyn && extras;
  }

  // The lookup's answer (see above); null with an exception set where it failed.
  PyObject* finish(PyObject* plan, Py_ssize_t nargs, PyObject* cache) {
    PyObject* result = nullptr;
    Py_ssize_t n_extras = PyList_GET_SIZE(extras);
    PyObject* key = PyTuple_New(4 + n_extras);
    if (key == nullptr) return nullptr;
    Py_INCREF(PyTuple_GET_ITEM(plan, 0));
    PyTuple_SET_ITEM(key, 0, PyTuple_GET_ITEM(plan, 0));
    PyTuple_SET_ITEM(key, 1, PyLong_FromSsize_t(nargs));
    PyTuple_SET_ITEM(key, 2, PyLong_FromLong(device));
    PyTuple_SET_ITEM(key, 3, PyBytes_FromStringAndSize(
        reinterpret_cast<const char*>(sig.data()), Py_ssize_t(sig.size() * 8)));
    for (Py_ssize_t i = 0; i < n_extras; ++i) {
      PyObject* x = PyList_GET_ITEM(extras, i);
      Py_INCREF(x);
      PyTuple_SET_ITEM(key, 4 + i, x);
    }
    PyObject* entry = PyDict_GetItemWithError(cache, key);  // borrowed
    if (entry != nullptr) {
      Py_ssize_t n_recs = PyList_GET_SIZE(recs);
      PyObject* values = PyTuple_New(n_recs);
      for (Py_ssize_t i = 0; values != nullptr && i < n_recs; ++i) {
        PyObject* v = rec_attr(PyList_GET_ITEM(recs, i), kRecValue, s_value);
        if (v == nullptr) Py_CLEAR(values);
        else PyTuple_SET_ITEM(values, i, v);
      }
      if (values != nullptr) {
        result = PyTuple_Pack(5, entry, recs, dyn, PyTuple_GET_ITEM(key, 2), values);
        Py_DECREF(values);
      }
    } else if (!PyErr_Occurred()) {
      result = PyTuple_Pack(2, Py_None, key);
    }
    Py_DECREF(key);
    return result;
  }

  void end() {
    Py_CLEAR(recs);
    Py_CLEAR(dyn);
    Py_CLEAR(extras);
    busy = false;
  }

  // The lookup's answer for a call of `nargs` arguments, `arg(i)` encoding argument i
  // (false where it cannot); null (no exception) where the call needs the Python key.
  // `tag` is the key's argument count (see above).
  template <typename Arg>
  PyObject* key(PyObject* table, PyObject* plan, Py_ssize_t nargs, Py_ssize_t tag,
                PyObject* cache, Arg arg) {
    if (busy) return nullptr;  // re-entered from a __hash__ or __eq__ of an argument
    busy = true;
    PyObject* result = nullptr;
    bool ok = start(table);
    try {
      for (Py_ssize_t i = 0; ok && i < nargs; ++i) ok = arg(i);
    } catch (const std::exception&) {
      ok = false;
    }
    if (ok && device >= 0) result = finish(plan, tag, cache);
    end();
    if (result == nullptr) PyErr_Clear();  // the Python key handles it (and raises its errors)
    return result;
  }
};

thread_local KeyBuilder kb;

// lookup(plan, args, records, cache): the key of a call made from Python (positional
// arguments only), see above.
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
  PyObject* result = kb.key(argv[2], plan, nargs, nargs, argv[3], [&](Py_ssize_t i) {
    PyObject* v = PyTuple_GET_ITEM(args, i);
    switch (PyLong_AsLong(PyTuple_GET_ITEM(codes, i))) {
      case kTensor: return kb.tensor(v);
      case kWrittenTensor: return kb.tensor(v, true);
      case kOptTensor:
        if (v != Py_None) return kb.tensor(v);
        kb.sig.push_back(-10);
        return true;
      case kTensorList: return kb.tensor_list(v);
      case kWrittenTensorList: return kb.tensor_list(v, true);
      case kStatic: return kb.fixed(v);
      case kScalar: return kb.scalar(v, PyTuple_GET_ITEM(defaults, i));
      case kOther: return kb.other(v);
      default: return false;
    }
  });
  if (result == nullptr) Py_RETURN_NONE;
  return result;
}

// --------------------------------------------------------- arguments as Python
// A Python number PyTorch wrapped as a CPU tensor (`x * 2.5`) as that number again, as a
// Python kernel gets it; null (no exception) for any other tensor.
PyObject* wrapped_number(const at::Tensor& t) {
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number()) return nullptr;
  switch (t.scalar_type()) {
    case c10::ScalarType::Double: return PyFloat_FromDouble(*t.const_data_ptr<double>());
    case c10::ScalarType::Long: return PyLong_FromLongLong(*t.const_data_ptr<int64_t>());
    case c10::ScalarType::Bool: return PyBool_FromLong(*t.const_data_ptr<bool>());
    case c10::ScalarType::ComplexDouble: {
      auto z = *t.const_data_ptr<c10::complex<double>>();
      return PyComplex_FromDoubles(z.real(), z.imag());
    }
    default: return nullptr;
  }
}

// A schema argument's value as the Python object a Python kernel gets (the dtype,
// layout and memory format numbers as their torch objects).
PyObject* to_python(const c10::IValue& v, const c10::Argument& arg) {
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isTensor()) {
    if (PyObject* number = wrapped_number(v.toTensor())) return number;
  }
  c10::TypePtr type = arg.real_type();
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType: {
      PyObject* d = reinterpret_cast<PyObject*>(torch::getTHPDtype(v.toScalarType()));
      Py_INCREF(d);
      return d;
    }
    case c10::TypeKind::LayoutType: {
      PyObject* l = reinterpret_cast<PyObject*>(torch::getTHPLayout(v.toLayout()));
      Py_INCREF(l);
      return l;
    }
    case c10::TypeKind::MemoryFormatType: {
      PyObject* m = torch::utils::getTHPMemoryFormat(v.toMemoryFormat());
      Py_INCREF(m);
      return m;
    }
    default:
      return torch::jit::toPyObject(v).release().ptr();
  }
}

// ---------------------------------------------------------------- recording
bool flag(PyObject* globals, PyObject* name) {
  return PyDict_GetItemWithError(globals, name) == Py_True;
}

// The node a cached op adds to the pending graph, built before anything is changed.
// The node, its inputs and run-time numbers and its lazy values are kept from the cyclic
// GC: a node refers to earlier nodes only, so they are in no cycle, and a pending graph
// of thousands of tracked objects made the GC's collections cost more than recording
// (6 tracked objects per pending op, 2 with these untracked). Storage records stay
// tracked: once their graph fails they hold its error, whose traceback refers to them.
struct PendingNode {
  py::object node;
  py::object device;          // the device, as a Python int
  PyObject* nodes = nullptr;  // graph._nodes
  PyObject* graph_device = nullptr;  // graph._device: None or `device`
  Py_ssize_t position = 0;
  Py_ssize_t cap = 0;

  // False (nothing changed) where the Python side must record: a graph pending for
  // another device, an op of another autograd graph task than the last one (the start
  // of a backward pass may flush: graph._backward_starts), or state of an unexpected
  // shape.
  bool build(PyObject* entry, PyObject* dyn, long index, PyObject* values) {
    PyObject* task = PyDict_GetItemWithError(S.graph, s_task);
    if (task == nullptr || !PyLong_CheckExact(task) ||
        PyLong_AsLong(task) != long(torch::autograd::get_current_graph_task_id()))
      return false;
    graph_device = PyDict_GetItemWithError(S.graph, s_graph_device);
    if (graph_device == nullptr) return false;
    if (graph_device != Py_None && PyLong_AsLong(graph_device) != index) return false;
    nodes = PyDict_GetItemWithError(S.graph, s_nodes);
    PyObject* max_ops = PyDict_GetItemWithError(S.graph, s_max_ops);
    if (nodes == nullptr || !PyList_CheckExact(nodes) || max_ops == nullptr) return false;
    cap = PyLong_AsSsize_t(max_ops);
    if (cap == -1 && PyErr_Occurred()) return false;
    PyObject* order = S.entry.get(entry, kEntryOrder);
    PyObject* ordered = S.entry.get(entry, kEntryOrdered);
    if (!order || !ordered || !PyList_Check(order)) return false;
    // The node's inputs: the records' values in the entry's argument order.
    py::object inputs;
    if (ordered == Py_True) {
      inputs = py::reinterpret_borrow<py::object>(values);
    } else {
      Py_ssize_t n = PyList_GET_SIZE(order);
      inputs = py::reinterpret_steal<py::object>(PyList_New(n));
      if (!inputs) return false;
      for (Py_ssize_t i = 0; i < n; ++i) {
        Py_ssize_t idx = PyLong_AsSsize_t(PyList_GET_ITEM(order, i));
        if (idx < 0 || idx >= PyTuple_GET_SIZE(values)) return false;
        PyObject* v = PyTuple_GET_ITEM(values, idx);
        Py_INCREF(v);
        PyList_SET_ITEM(inputs.ptr(), i, v);
      }
    }
    device = py::reinterpret_steal<py::object>(PyLong_FromLong(index));
    position = PyList_GET_SIZE(nodes);
    node = py::reinterpret_steal<py::object>(S.node.make(true));
    PyObject* pos = PyLong_FromSsize_t(position);
    if (!device || !node || !pos) {
      Py_XDECREF(pos);
      return false;
    }
    PyObject_GC_UnTrack(inputs.ptr());
    PyObject_GC_UnTrack(dyn);
    S.node.put(node.ptr(), kNodeEntry, py::reinterpret_borrow<py::object>(entry).release().ptr());
    S.node.put(node.ptr(), kNodeInputs, inputs.release().ptr());
    S.node.put(node.ptr(), kNodeDyn, py::reinterpret_borrow<py::object>(dyn).release().ptr());
    S.node.put(node.ptr(), kNodePosition, pos);
    return true;
  }

  // Output `index` of the node, of aval ((numel,), jax dtype).
  py::object lazy(long index, PyObject* aval) const {
    py::object z = py::reinterpret_steal<py::object>(S.lazy.make(true));
    if (!z) throw py::error_already_set();
    S.lazy.put(z.ptr(), kLazyNode, py::object(node).release().ptr());
    S.lazy.put(z.ptr(), kLazyIndex, PyLong_FromLong(index));
    S.lazy.put(z.ptr(), kLazyShape, py::reinterpret_borrow<py::object>(
                                        PyTuple_GET_ITEM(aval, 0)).release().ptr());
    S.lazy.put(z.ptr(), kLazyDtype, py::reinterpret_borrow<py::object>(
                                        PyTuple_GET_ITEM(aval, 1)).release().ptr());
    return z;
  }

  // The node joins the graph (graph._append's bookkeeping) and the hit is counted.
  void append() const {
    if (PyList_Append(nodes, node.ptr()) != 0 ||
        PyDict_SetItem(S.graph, s_pending, Py_True) != 0 ||
        (graph_device == Py_None && PyDict_SetItem(S.graph, s_graph_device, device.ptr()) != 0) ||
        (position + 1 >= cap && PyDict_SetItem(S.graph, s_due, Py_True) != 0))
      throw py::error_already_set();
    PyObject* hits = PyDict_GetItemWithError(S.counts, s_cache_hits);
    if (hits != nullptr) {
      py::object more = py::reinterpret_steal<py::object>(
          PyNumber_Add(hits, py::int_(1).ptr()));
      if (!more || PyDict_SetItem(S.counts, s_cache_hits, more.ptr()) != 0)
        throw py::error_already_set();
    }
  }
};

// An aval ((numel,), jax dtype) as the entry lists it; null where it is not one.
PyObject* flat_aval(PyObject* avals, Py_ssize_t i) {
  if (!PyList_Check(avals) || i >= PyList_GET_SIZE(avals)) return nullptr;
  PyObject* aval = PyList_GET_ITEM(avals, i);
  if (!PyTuple_Check(aval) || PyTuple_GET_SIZE(aval) != 2) return nullptr;
  PyObject* flat = PyTuple_GET_ITEM(aval, 0);
  if (!PyTuple_Check(flat) || PyTuple_GET_SIZE(flat) != 1) return nullptr;
  return aval;
}

// StorageRecord.set(lazy): a storage record's value, and the dtype and element count
// of its aval ((numel,), jax dtype).
void set_value(PyObject* rec, py::object lazy, PyObject* aval) {
  PyObject* jdtype = PyTuple_GET_ITEM(aval, 1);
  PyObject* numel = PyTuple_GET_ITEM(PyTuple_GET_ITEM(aval, 0), 0);
  S.rec.put(rec, kRecValue, lazy.release().ptr());
  Py_INCREF(jdtype);
  S.rec.put(rec, kRecDtype, jdtype);
  Py_INCREF(numel);
  S.rec.put(rec, kRecNumel, numel);
}

// graph.record_single() of a cached op whose one fresh result is the call's return:
// false (nothing changed) where the Python side must do it (see PendingNode::build;
// memory near its limit, where the graph may have to run first).
bool record_single(PyObject* entry, PyObject* dyn, long device, PyObject* values,
                   at::Tensor* out) {
  PyObject* outs = S.entry.get(entry, kEntryOuts);
  PyObject* avals = S.entry.get(entry, kEntryAvals);
  if (!outs || !avals || !PyList_Check(outs) || PyList_GET_SIZE(outs) != 1) return false;
  PyObject* o = PyList_GET_ITEM(outs, 0);  // (shape, stride, dtype, jax dtype, nbytes)
  PyObject* aval = flat_aval(avals, 0);
  if (aval == nullptr || !PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 5 ||
      !THPDtype_Check(PyTuple_GET_ITEM(o, 2)))
    return false;
  c10::SmallVector<int64_t, 8> size, stride;
  for (int k = 0; k < 2; ++k) {
    PyObject* seq = PyTuple_GET_ITEM(o, k);
    if (!PyTuple_Check(seq)) return false;
    auto& dst = k == 0 ? size : stride;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); ++i) {
      int64_t x = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
      if (x == -1 && PyErr_Occurred()) return false;
      dst.push_back(x);
    }
  }
  int64_t nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 4));
  if (nbytes == -1 && PyErr_Occurred()) return false;
  PendingNode p;
  if (!p.build(entry, dyn, device, values)) return false;
  // The memory account: near the limit the Python side asks for the graph to run.
  PyObject* mem = PyDict_GetItemWithError(S.devices, p.device.ptr());
  if (mem == nullptr || !S.mem.is(mem)) return false;
  int64_t allocated = PyLong_AsLongLong(S.mem.get(mem, kMemAllocated));
  int64_t soft_limit = PyLong_AsLongLong(S.mem.get(mem, kMemSoftLimit));
  int64_t peak = PyLong_AsLongLong(S.mem.get(mem, kMemPeak));
  int64_t allocs = PyLong_AsLongLong(S.mem.get(mem, kMemAllocs));
  int64_t frees = PyLong_AsLongLong(S.mem.get(mem, kMemFrees));
  int64_t ever = PyLong_AsLongLong(S.mem.get(mem, kMemTotal));
  int64_t live_peak = PyLong_AsLongLong(S.mem.get(mem, kMemLivePeak));
  if (PyErr_Occurred()) return false;
  int64_t total = allocated + nbytes;
  if (total > soft_limit) return false;

  py::object rec = py::reinterpret_steal<py::object>(S.rec.make());
  if (!rec) return false;
  set_value(rec.ptr(), p.lazy(0, aval), aval);
  PyObject* nb = PyTuple_GET_ITEM(o, 4);
  Py_INCREF(nb);
  S.rec.put(rec.ptr(), kRecNbytes, nb);
  S.rec.put(rec.ptr(), kRecDevice, py::object(p.device).release().ptr());

  auto dtype = reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(o, 2))->scalar_type;
  at::Tensor t = empty_pjrt(size, stride, dtype, int(device));  // may throw: nothing filed yet
  py::object handle = py::reinterpret_steal<py::object>(
      PyLong_FromSize_t(reinterpret_cast<uintptr_t>(t.storage().data())));
  if (!handle || PyDict_SetItem(S.records, handle.ptr(), rec.ptr()) != 0)
    throw py::error_already_set();
  // From here on the storage is in the table: account for it before anything can fail.
  S.mem.put(mem, kMemAllocated, PyLong_FromLongLong(total));
  S.mem.put(mem, kMemAllocs, PyLong_FromLongLong(allocs + 1));
  S.mem.put(mem, kMemTotal, PyLong_FromLongLong(ever + nbytes));
  if (total > peak) S.mem.put(mem, kMemPeak, PyLong_FromLongLong(total));
  if (allocs + 1 - frees > live_peak)
    S.mem.put(mem, kMemLivePeak, PyLong_FromLongLong(allocs + 1 - frees));
  p.append();
  *out = std::move(t);
  return true;
}

// graph.record() and launch.outputs() of a cached in-place op (it returns the
// argument it writes, and nothing fresh): its written storages get the node's lazy
// values, their concrete old buffers noted as superseded (donated at the flush).
bool record_in_place(PyObject* entry, PyObject* recs, PyObject* dyn, long device,
                     PyObject* values) {
  PyObject* written = S.entry.get(entry, kEntryWritten);
  PyObject* avals = S.entry.get(entry, kEntryAvals);
  PyObject* superseded = PyDict_GetItemWithError(S.graph, s_superseded);
  if (!written || !avals || !superseded || !PyTuple_Check(written) || !PyList_Check(avals) ||
      !PyDict_CheckExact(superseded) || PyList_GET_SIZE(avals) != PyTuple_GET_SIZE(written))
    return false;
  Py_ssize_t n = PyTuple_GET_SIZE(written);
  c10::SmallVector<PyObject*, 4> targets, target_avals;  // borrowed from recs and avals
  for (Py_ssize_t i = 0; i < n; ++i) {
    Py_ssize_t buf = PyLong_AsSsize_t(PyTuple_GET_ITEM(written, i));
    PyObject* aval = flat_aval(avals, i);
    if (buf < 0 || buf >= PyList_GET_SIZE(recs) || aval == nullptr) return false;
    PyObject* rec = PyList_GET_ITEM(recs, buf);
    if (!S.rec.is(rec) || S.rec.get(rec, kRecValue) == nullptr) return false;
    targets.push_back(rec);
    target_avals.push_back(aval);
  }
  PendingNode p;
  if (!p.build(entry, dyn, device, values)) return false;
  c10::SmallVector<py::object, 4> lazies;
  for (Py_ssize_t i = 0; i < n; ++i) lazies.push_back(p.lazy(long(i), target_avals[size_t(i)]));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* rec = targets[size_t(i)];
    PyObject* old = S.rec.get(rec, kRecValue);
    if (old != Py_None && Py_TYPE(old) != S.lazy.type) {
      py::object id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(old));
      if (!id || PyDict_SetDefault(superseded, id.ptr(), rec) == nullptr)
        throw py::error_already_set();
    }
  }
  p.append();
  for (Py_ssize_t i = 0; i < n; ++i)
    set_value(targets[size_t(i)], std::move(lazies[size_t(i)]), target_avals[size_t(i)]);
  return true;
}

// ------------------------------------------------------------------ the kernel
// Whether a tensor list argument holds a boolean (or uint8) mask or indices on the CPU:
// indexing with a mask has a data-dependent result, and PyTorch takes CPU indices into a
// tensor on any device; the op's Python kernel turns masks into indices and copies CPU
// indices to the device first (eager/dynamic.py's _has_mask: keep the two alike).
bool has_mask(c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue& v : args) {
    if (!v.isList()) continue;
    for (const c10::IValue& x : v.toListRef()) {
      if (!x.isTensor() || !x.toTensor().defined()) continue;
      const at::Tensor& index = x.toTensor();
      auto t = index.scalar_type();
      if (t == c10::ScalarType::Bool || t == c10::ScalarType::Byte || index.is_cpu())
        return true;
    }
  }
  return false;
}

// The registration library of a namespace for one dispatch key (never freed: the kernels
// registered through it live as long as the process).
torch::Library* library(const std::string& ns, c10::DispatchKey key) {
  static std::map<std::pair<std::string, c10::DispatchKey>, torch::Library*> libraries;
  torch::Library*& lib = libraries[{ns, key}];
  if (lib == nullptr)
    lib = new torch::Library(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return lib;
}

// A Python kernel's result onto the stack, by the op's schema.
void push_returns(const c10::FunctionSchema& schema, const py::object& result,
                  torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].real_type()));
  } else if (returns.size() > 1) {
    py::tuple items = result.cast<py::tuple>();
    TORCH_CHECK(items.size() == returns.size(), "pjrt: ", schema.name(), " returned ",
                items.size(), " values, its schema has ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i)
      stack->push_back(torch::jit::toIValue(items[i], returns[i].real_type()));
  }
}

// The PrivateUse1 kernel of one lowered op.
struct OpKernel final : c10::OperatorKernel {
  PyObject* spec;  // opspec.OpSpec (strong references, never released: ops live forever)
  PyObject* plan;  // spec.plan
  PyObject* masks;  // the op's Python kernel for calls indexing with masks, or None

  OpKernel(py::object s, py::object p, py::object m)
      : spec(s.release().ptr()), plan(p.release().ptr()), masks(m.release().ptr()) {}

  // The key of the call's arguments (every schema argument, from the stack).
  PyObject* find(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
    PyObject* codes = PyTuple_GET_ITEM(plan, 1);
    PyObject* defaults = PyTuple_GET_ITEM(plan, 2);
    Py_ssize_t n = Py_ssize_t(args.size());
    if (n != PyTuple_GET_SIZE(codes)) return nullptr;
    return kb.key(S.records, plan, n, -n, S.cache, [&](Py_ssize_t i) {
      const c10::IValue& v = args[size_t(i)];
      long code = PyLong_AsLong(PyTuple_GET_ITEM(codes, i));
      if (code == kTensor || code == kOptTensor || code == kWrittenTensor) {
        if (code == kOptTensor && (v.isNone() || (v.isTensor() && !v.toTensor().defined()))) {
          kb.sig.push_back(-10);
          return true;
        }
        if (!v.isTensor()) return false;
        if (PyObject* number = wrapped_number(v.toTensor())) {
          bool ok = kb.number(number);
          Py_DECREF(number);
          return ok;
        }
        return kb.tensor(v.toTensor(), code == kWrittenTensor);
      }
      if (code == kTensorList || code == kWrittenTensorList)
        return kb.tensor_list(v, code == kWrittenTensorList);
      if (code != kStatic && code != kScalar && code != kOther) return false;
      if (v.isTensor() || v.isTensorList() || v.isGenerator() || v.isDevice()) return false;
      py::object o = py::reinterpret_steal<py::object>(
          to_python(v, schema.arguments()[size_t(i)]));
      if (!o) return false;
      if (code == kStatic) return kb.fixed(o.ptr());
      if (code == kScalar) return kb.scalar(o.ptr(), PyTuple_GET_ITEM(defaults, i));
      return kb.other(o.ptr());
    });
  }

  // A fused hit recorded here, its return on the stack: an op returning one fresh tensor
  // or an in-place op returning the argument it writes. False where Python records it.
  static bool record(PyObject* entry, PyObject* hit, c10::ArrayRef<c10::IValue> args,
                     torch::jit::Stack* stack) {
    PyObject* recs = PyTuple_GET_ITEM(hit, 1);
    PyObject* dyn = PyTuple_GET_ITEM(hit, 2);
    long device = PyLong_AsLong(PyTuple_GET_ITEM(hit, 3));
    PyObject* values = PyTuple_GET_ITEM(hit, 4);
    PyObject* alias = S.entry.get(entry, kEntryAliasReturn);
    c10::IValue ret;
    if (S.entry.get(entry, kEntrySingle) == Py_True) {
      at::Tensor out;
      if (!record_single(entry, dyn, device, values, &out)) return false;
      ret = std::move(out);
    } else if (alias != nullptr && PyLong_CheckExact(alias)) {
      long a = PyLong_AsLong(alias);
      if (a < 0 || size_t(a) >= args.size() || !args[size_t(a)].isTensor() ||
          !record_in_place(entry, recs, dyn, device, values))
        return false;
      ret = args[size_t(a)];
    } else {
      return false;
    }
    torch::jit::drop(*stack, args.size());
    stack->push_back(std::move(ret));
    if (flag(S.graph, s_due)) {
      PyObject* r = PyObject_CallNoArgs(S.flush_due);
      if (r == nullptr) throw py::error_already_set();
      Py_DECREF(r);
    }
    return true;
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    OpsLocked locked;  // threads take turns (shim.h)
    const auto& schema = op.schema();
    size_t n = schema.arguments().size();
    auto args = torch::jit::last(*stack, n);
    py::gil_scoped_acquire gil;
    py::object found = py::none();
    bool masked = masks != Py_None && has_mask(args);
    if (!masked && !flag(S.modes, s_debug)) {
      PyObject* hit = find(schema, args);
      if (hit != nullptr) found = py::reinterpret_steal<py::object>(hit);
      PyObject* entry = hit != nullptr ? PyTuple_GET_ITEM(hit, 0) : nullptr;
      if (entry != nullptr && PyTuple_GET_SIZE(hit) == 5 && S.entry.is(entry) &&
          flag(S.modes, s_fused) && S.entry.get(entry, kEntryAlone) == Py_False &&
          !python_records && record(entry, hit, args, stack))
        return;
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    // Everything else: the executor's Python code, with every argument by position.
    py::tuple values(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = to_python(args[i], schema.arguments()[i]);
      if (v == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(values.ptr(), Py_ssize_t(i), v);
    }
    PyObject* r = masked ? PyObject_Call(masks, values.ptr(), nullptr)
                         : PyObject_CallFunctionObjArgs(S.call, spec, found.ptr(), values.ptr(),
                                                        nullptr);
    if (r == nullptr) throw py::error_already_set();
    torch::jit::drop(*stack, n);
    push_returns(schema, py::reinterpret_steal<py::object>(r), stack);
  }
};

// ------------------------------------------------------------ autograd kernel
// The AutogradPrivateUse1 kernel of a custom operator with a pjrt kernel
// (kernels/autograd_kernel.py). Without gradients to record (grad mode off, or no tensor
// argument requiring grad) the call goes below autograd to the op's pjrt kernel in C++,
// as a built-in op's does; the Python autograd kernel that custom_op and the jax.vjp
// formula use (torch._library.autograd) costs several times the op itself there. With
// gradients, `slow(keyset, *arguments)` (that Python kernel) runs.
bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() && v.toTensor().requires_grad();
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined() && t.requires_grad()) return true;
    return false;
  }
  if (v.isList()) {
    for (const c10::IValue& x : v.toListRef())
      if (requires_grad(x)) return true;
  }
  return false;
}

struct AutogradKernel final : c10::OperatorKernel {
  // A strong reference never released, as OpKernel's: kernels live until the process
  // ends, when the dispatcher's destruction can no longer take the GIL.
  PyObject* slow;

  explicit AutogradKernel(py::object slow_) : slow(slow_.release().ptr()) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    size_t n = schema.arguments().size();
    auto args = torch::jit::last(*stack, n);
    bool grad = false;
    if (at::GradMode::is_enabled())
      for (const c10::IValue& v : args) grad = grad || requires_grad(v);
    if (!grad) {
      c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
      return;
    }
    py::gil_scoped_acquire gil;
    py::tuple values(n + 1);
    values[0] = py::cast(keys);
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = to_python(args[i], schema.arguments()[i]);
      if (v == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(values.ptr(), Py_ssize_t(i + 1), v);
    }
    PyObject* r = PyObject_Call(slow, values.ptr(), nullptr);
    if (r == nullptr) throw py::error_already_set();
    torch::jit::drop(*stack, n);
    push_returns(schema, py::reinterpret_steal<py::object>(r), stack);
  }
};

// register_autograd_kernel(namespace, name, slow): the kernel above for one operator.
void register_autograd_kernel(const std::string& ns, const std::string& name,
                              py::object slow) {
  library(ns, c10::DispatchKey::AutogradPrivateUse1)
      ->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                               std::make_unique<AutogradKernel>(std::move(slow))));
}

// register_op_kernels(namespace, [(name, spec, masks), ...]): the kernel above for each
// op; `masks`: its Python kernel for calls indexing with boolean masks, or None.
void register_op_kernels(const std::string& ns,
                         const std::vector<std::tuple<std::string, py::object, py::object>>& ops) {
  TORCH_CHECK(configured, "pjrt: configure_op_kernel() first");
  torch::Library* lib = library(ns, c10::DispatchKey::PrivateUse1);
  for (const auto& [name, spec, masks] : ops) {
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                std::make_unique<OpKernel>(spec, spec.attr("plan"), masks)));
  }
}

void configure(py::dict graph, py::dict modes, py::dict counts, py::dict devices,
               py::dict records, py::dict cache, py::object call, py::object flush_due,
               py::handle node, py::handle lazy, py::handle rec, py::handle entry,
               py::handle mem) {
  S.graph = graph.release().ptr();
  S.modes = modes.release().ptr();
  S.counts = counts.release().ptr();
  S.devices = devices.release().ptr();
  S.records = records.release().ptr();
  S.cache = cache.release().ptr();
  S.call = call.release().ptr();
  S.flush_due = flush_due.release().ptr();
  S.node.init(node, {"entry", "inputs", "dyn", "position"});
  S.lazy.init(lazy, {"node", "index", "shape", "dtype"});
  S.rec.init(rec, {"value", "dtype", "numel", "nbytes", "device"});
  S.entry.init(entry, {"single", "alone", "ordered", "order", "outs", "result_avals",
                       "written", "alias_return"});
  S.mem.init(mem, {"allocated", "peak", "allocs", "soft_limit", "frees", "total", "live_peak"});
  configured = true;
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
  at::Tensor t = empty_pjrt(size, stride, dtype, int(PyLong_AsLong(argv[3])));
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
     METH_FASTCALL, "A tensor on a new storage, filed in the storage table (see op_kernel.cpp)."},
    {"lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&lookup)), METH_FASTCALL,
     "The op cache entry of a call from Python (see op_kernel.cpp)."},
    {nullptr, nullptr, 0, nullptr}};

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

}  // namespace

void add_op_kernel(py::module& m) {
  s_numel = intern("numel");
  s_dtype = intern("dtype");
  s_value = intern("value");
  s_device = intern("device");
  s_fused = intern("fused");
  s_debug = intern("debug");
  s_nodes = intern("_nodes");
  s_graph_device = intern("_device");
  s_pending = intern("pending");
  s_due = intern("due");
  s_max_ops = intern("max_ops");
  s_cache_hits = intern("cache_hits");
  s_superseded = intern("_superseded");
  s_task = intern("_task");
  if (PyModule_AddFunctions(m.ptr(), fast_methods) != 0) throw py::error_already_set();
  m.def("configure_op_kernel", &configure);
  m.def("register_op_kernels", &register_op_kernels);
  m.def("register_autograd_kernel", &register_autograd_kernel);
  m.def("set_python_records", [](bool on) { python_records = on; });
}

}  // namespace torch_pjrt
