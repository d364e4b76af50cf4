// torch.profiler's view of the pjrt device: a Kineto child profiler (IActivityProfiler)
// registered for PrivateUse1. PyTorch has no Python hook for device activity; this file
// only connects Kineto's session calls to the Python side (runtime/device_trace.py),
// which times each program run, transfer, compile, flush and synchronization and hands
// them back here as activities when the session stops.
//
// Kineto calls, per profile: configure (a session), start, the correlation id of every
// op as it begins and ends (push/pop, on the op's thread), stop, processTrace (which
// links each activity to the op that launched it) and getTraceBuffer (which takes the
// activities' ownership).

#include <torch/csrc/utils/pybind.h>

#include "shim.h"

#if __has_include(<IActivityProfiler.h>) && defined(USE_KINETO)
#define TORCH_PJRT_KINETO 1
// Kineto's headers format with fmt, which libtorch keeps to itself: compiled in here.
#define FMT_HEADER_ONLY
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#endif

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace py = pybind11;

namespace {

// Python callbacks (device_trace.py), leaked on purpose like the shim's: a session may
// stop while the interpreter exits.
py::object* on_start = nullptr;  // on_start() -> None
py::object* on_stop = nullptr;   // on_stop() -> [activity tuples] (see Session::stop)

// The correlation ids of the ops (and record_function ranges) being run on this thread,
// innermost last: what a program launched now is linked to.
thread_local std::vector<uint64_t> op_ids;
thread_local std::vector<uint64_t> range_ids;

uint64_t current_correlation() {
  if (!op_ids.empty()) return op_ids.back();
  if (!range_ids.empty()) return range_ids.back();
  return 0;
}

#ifdef TORCH_PJRT_KINETO
using libkineto::ActivityType;

// What Python hands over, by kind: a program run, a transfer and a collective are device
// activities (their own track per device), the rest happen on a host thread.
ActivityType activity_type(int kind) {
  switch (kind) {
    case 0: return ActivityType::CONCURRENT_KERNEL;
    case 1: return ActivityType::GPU_MEMCPY;
    case 3: return ActivityType::CONCURRENT_KERNEL;
    default: return ActivityType::PRIVATEUSE1_RUNTIME;
  }
}

constexpr int kKindRuntime = 2;
const char* const kStreamNames[] = {"programs", "transfers", "collectives"};

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    status_ = libkineto::TraceStatus::RECORDING;
    call(on_start);
  }

  // Each activity from Python: (kind, name, start ns, end ns, device, stream or thread id,
  // correlation id, {metadata key: int, float or JSON-escaped str}).
  void stop() override {
    status_ = libkineto::TraceStatus::PROCESSING;
    py::gil_scoped_acquire gil;
    py::object events = call(on_stop);
    if (events.is_none()) return;
    int32_t pid = int32_t(getpid());
    for (py::handle item : events) {
      auto t = item.cast<py::tuple>();
      int kind = t[0].cast<int>();
      buffer_->emplace_activity(buffer_->span, activity_type(kind), t[1].cast<std::string>());
      auto& act = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
      act.startTime = t[2].cast<int64_t>();
      act.endTime = t[3].cast<int64_t>();
      act.device = kind == kKindRuntime ? pid : t[4].cast<int32_t>();
      act.resource = t[5].cast<int32_t>();
      act.id = int32_t(next_id_++);
      act.threadId = act.resource;
      for (auto kv : t[7].cast<py::dict>()) {
        std::string key = kv.first.cast<std::string>();
        if (py::isinstance<py::str>(kv.second))
          act.addMetadataQuoted(key, kv.second.cast<std::string>());
        else
          act.addMetadata(key, py::str(kv.second).cast<std::string>());
      }
      links_.push_back(int32_t(t[6].cast<int64_t>()));
      if (kind != kKindRuntime) {
        devices_.insert(act.device);
        tracks_.insert({act.device, act.resource});
      }
    }
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t, int64_t) override {
    int64_t start = buffer_->span.startTime;
    for (int32_t d : devices_) {
      // device 0 is named by getDeviceInfo(), which Kineto asks for once
      if (d != 0) logger.handleDeviceInfo(device_info(d), start);
      for (auto [device, s] : tracks_)
        if (device == d) logger.handleResourceInfo(resource_info(d, s), start);
    }
    size_t i = 0;
    for (auto& act : buffer_->activities) {
      int32_t link = links_[i++];
      if (linked && link != 0) act->linked = linked(link);
      act->log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(device_info(0));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  void pushCorrelationId(uint64_t id) override { op_ids.push_back(id); }
  void popCorrelationId() override {
    if (!op_ids.empty()) op_ids.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override { range_ids.push_back(id); }
  void popUserCorrelationId() override {
    if (!range_ids.empty()) range_ids.pop_back();
  }

  ~Session() override {
    // a session that never stopped must not leave ids behind for the next one
    op_ids.clear();
    range_ids.clear();
  }

 private:
  static libkineto::DeviceInfo device_info(int32_t d) {
    return {d, libkineto::kExceedMaxPid + d, "pjrt:" + std::to_string(d), "pjrt"};
  }
  static libkineto::ResourceInfo resource_info(int32_t d, int32_t s) {
    return {s, s, d, kStreamNames[s]};
  }

  py::object call(py::object* fn) {
    if (fn == nullptr || !Py_IsInitialized()) return py::none();
    py::gil_scoped_acquire gil;
    try {
      return (*fn)();
    } catch (py::error_already_set& e) {
      errors_.push_back(std::string("pjrt profiler: ") + e.what());
      status_ = libkineto::TraceStatus::ERROR;
      return py::none();
    }
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = [] {
    auto b = std::make_unique<libkineto::CpuTraceBuffer>();
    b->gpuOpCount = -1;
    return b;
  }();
  std::vector<int32_t> links_;
  std::set<int32_t> devices_;
  std::set<std::pair<int32_t, int32_t>> tracks_;  // (device, stream) with activities
  std::vector<std::string> errors_;
  int64_t next_id_ = 1;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activity_types, const libkineto::Config&) override {
    for (auto t : activity_types)
      if (types_.count(t)) return std::make_unique<Session>();
    return nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_ = "pjrt";
  std::set<ActivityType> types_ = {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                   ActivityType::PRIVATEUSE1_RUNTIME};
};
#endif  // TORCH_PJRT_KINETO

// Registers the profiler with PyTorch (which hands it to Kineto when a profile with the
// PrivateUse1 activity is prepared); false where this torch has no Kineto.
bool install(py::object start_fn, py::object stop_fn) {
  static std::once_flag once;
  on_start = new py::object(std::move(start_fn));
  on_stop = new py::object(std::move(stop_fn));
#ifdef TORCH_PJRT_KINETO
  std::call_once(once, [] {
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        [] { return std::make_unique<Profiler>(); });
  });
  return true;
#else
  return false;
#endif
}

}  // namespace

void torch_pjrt::add_profiler(py::module& m) {
  m.def("profiler_install", &install);
  m.def("profiler_correlation", [] { return current_correlation(); });
}
