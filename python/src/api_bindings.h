// Shared by the bindings of Viper's API classes (Snapshot, Node, Publisher, Subscriber): the
// handle types Python holds, tensors in and out of numpy, the options tables, and the helpers that
// start and guard a handle. Internal to the extension module.
// REQUIRES: the GIL is held in every function here unless a comment says otherwise.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "options.h"
#include "viper/gpu_publisher.h"
#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"

namespace viper_py {

// ---------------------------------------------------------------- tensors (tensor_views.cc)

py::dtype NumpyDtype(viper::DType dtype);
py::array TensorView(const viper::Snapshot& snap, const viper::TensorInfo& tensor, py::handle base);
py::dict TensorDescriptions(const viper::Snapshot& snap);

// Both Python-facing snapshot types expose the same read-only mapping.
// Copies tensor `name` of `snap` to the `nbytes` bytes at `address`, for each (name, address,
// nbytes), with the GIL released: one streaming copy each (viper/memory.h), where torch's copy_
// ran at 0.55-0.6x memcpy. Every entry is checked before the first byte moves (KeyError for an
// unknown name, InvalidArgumentError for a size that differs).
// REQUIRES: each address points to nbytes of writable memory that does not overlap the snapshot
// and stays valid for the call (the caller holds the tensors).
void CopyTensorsInto(const viper::Snapshot& snap,
                     const std::vector<std::tuple<std::string, uintptr_t, uint64_t>>& targets);

template <typename Handle, typename Class>
void BindTensorMapping(Class& cls) {
  cls.def("__len__", [](const Handle& h) { return h.snapshot().tensors().size(); })
      .def("__contains__", [](const Handle& h, const std::string& name) { return h.snapshot().find(name) != nullptr; })
      .def("__iter__", [](const Handle& h) {
        py::list names;
        for (const auto& t : h.snapshot().tensors()) names.append(t.name);
        return py::iter(names);
      })
      .def("keys", [](const Handle& h) {
        py::list names;
        for (const auto& t : h.snapshot().tensors()) names.append(t.name);
        return names;
      }, "Tensor names in data order.")
      .def("__getitem__", [](py::object self, const std::string& name) {
        const Handle& h = self.cast<const Handle&>();
        const viper::TensorInfo* t = h.snapshot().find(name);
        if (t == nullptr) throw py::key_error(name);
        return TensorView(h.snapshot(), *t, self);
      }, "The tensor as a read-only numpy view of the buffer (no copy). BF16 comes back as uint16 bits, F8 as uint8.")
      .def("items", [](py::object self) {
        const Handle& h = self.cast<const Handle&>();
        py::list out;
        for (const auto& t : h.snapshot().tensors()) out.append(py::make_tuple(t.name, TensorView(h.snapshot(), t, self)));
        return out;
      }, "(name, read-only numpy view) pairs in data order.")
      .def_property_readonly("dtypes", [](const Handle& h) { return TensorDescriptions(h.snapshot()); },
                             "{name: (safetensors dtype name, shape)}.")
      .def_property_readonly("metadata", [](const Handle& h) { return h.snapshot().metadata(); },
                             "The header's __metadata__ (viper.* keys included), str -> str.")
      .def_property_readonly("nbytes", [](const Handle& h) { return h.snapshot().bytes().size(); },
                             "Size of the whole safetensors buffer.")
      .def("_copy_into", [](const Handle& h, const std::vector<std::tuple<std::string, uintptr_t, uint64_t>>& targets) {
        CopyTensorsInto(h.snapshot(), targets);
      }, py::arg("targets"),
         "Internal (load_into's CPU path): copies each named tensor's bytes to (address, nbytes), GIL released.")
      .def_property_readonly("buffer_address", [](const Handle& h) {
        return reinterpret_cast<uintptr_t>(h.snapshot().bytes().data());
      }, "Address of the buffer the views point into (for checking where the memory lives).");
}

// Registers the buffer of a Snapshot or ModelVersion object while the object (and so every numpy
// view of it) lives, so that load_into can refuse a target tensor inside one: such a tensor is a
// read-only view (version.state_dict()), and writing into a mapped version kills the process
// (SIGSEGV), into a private one changes it for every holder. Thread-safe (a process-wide registry).
class ViewedBuffer {
 public:
  explicit ViewedBuffer(std::span<const std::byte> bytes);
  ViewedBuffer(const ViewedBuffer& other);  // registers the range once more
  ViewedBuffer& operator=(const ViewedBuffer&) = delete;
  ~ViewedBuffer();

 private:
  uintptr_t begin_;
  uintptr_t end_;
};

// The index of the first (address, nbytes) range that overlaps a registered buffer, or -1.
int64_t FirstInViewedBuffer(const std::vector<std::pair<uintptr_t, uint64_t>>& ranges);

struct SnapshotHandle {
  explicit SnapshotHandle(viper::Snapshot s) : snap(std::move(s)), viewed(snap.bytes()) {}
  viper::Snapshot snap;
  ViewedBuffer viewed;
  const viper::Snapshot& snapshot() const { return snap; }
};

struct VersionHandle {
  explicit VersionHandle(std::shared_ptr<const viper::ModelVersion> v)
      : version(std::move(v)), viewed(version->snapshot.bytes()) {}
  std::shared_ptr<const viper::ModelVersion> version;
  ViewedBuffer viewed;
  const viper::Snapshot& snapshot() const { return version->snapshot; }
};


// (name, dtype name, shape, buffer) tuples from python/viper/_tensors.py -> TensorData. The
// buffers stay referenced by `items` (held by the caller) for as long as the spans are used.
struct HeldTensors {
  std::vector<viper::TensorData> tensors;
  std::vector<py::buffer_info> buffers;
};
HeldTensors HoldTensors(const py::list& items);

// User metadata as strings; keys under viper.* are refused (InvalidArgumentError).
std::map<std::string, std::string> StringMetadata(const py::dict& metadata);

// ---------------------------------------------------------------- options (options_bindings.cc)

// Node, Publisher and Subscriber take their options as keyword arguments with the names and
// defaults of the C++ structs (options.h); the node's table is defined once and included in the
// publisher's (a Publisher embeds a node).
OptionsTable<viper::NodeOptions> NodeOptionsTable();
OptionsTable<viper::PublisherOptions> PublisherOptionsTable();
OptionsTable<viper::SubscriberOptions> SubscriberOptionsTable();
void BindOptionsClasses(py::module_& m);

// ---------------------------------------------------------------- handles

// Starts a Node, Publisher or Subscriber (they listen or connect, which may block) with the GIL
// released; raises the mapped exception on failure.
template <typename T, typename Options>
std::unique_ptr<T> StartWithoutGil(const Options& options) {
  viper::Result<std::unique_ptr<T>> started = viper::Status::OK();
  {
    py::gil_scoped_release release;
    started = T::Start(options);
  }
  return Unwrap(std::move(started));
}

// Handles own their C++ object until close(); every method after close() raises.
template <typename Pointer>
auto& Open(const Pointer& p, const char* what) {
  if (!p) Raise(viper::Status(viper::StatusCode::kFailedPrecondition, std::string(what) + " is closed"));
  return *p;
}

struct NodeHandle {
  std::shared_ptr<viper::Node> node;
};

struct PublisherHandle {
  std::shared_ptr<viper::Publisher> publisher;
  double last_stall_seconds = 0.0;
  // CUDA tensors' versions (publish_device, begin_device): started at the first GPU call, on that
  // device. Each call takes its own reference (GpuOf, publisher_bindings.cc) and drops it before
  // it returns, so that close() on another thread never frees it under a call; its deleter holds a
  // reference to the Publisher, which therefore outlives it whoever drops it last. gpu, gpu_device
  // and gpu_closed are guarded by gpu_mu, held briefly; gpu_start_mu is held while a first call
  // starts the GpuPublisher (without the GIL), so that only one starts.
  std::mutex gpu_start_mu;
  std::mutex gpu_mu;
  std::shared_ptr<viper::GpuPublisher> gpu;
  int gpu_device = -1;
  bool gpu_closed = false;  // close() ran: no GpuPublisher starts any more
  uint64_t last_device_version = 0;
};

struct SubscriberHandle {
  std::shared_ptr<viper::Subscriber> subscriber;
};

// A version's catalog entry as a dict (node_bindings.cc).
py::dict VersionInfoDict(const viper::proto::VersionInfo& info);
// A node's counters by name (StatsCounters) and its latency histograms under "histograms":
// {name: {"buckets": [(upper bound in seconds, cumulative count), ..., (inf, count)], "count", "sum_seconds"}}.
py::dict NodeStatsDict(const viper::NodeStats& stats);

void BindNode(py::module_& m);        // node_bindings.cc
void BindPublisher(py::module_& m);   // publisher_bindings.cc
void BindSubscriber(py::module_& m);  // subscriber_bindings.cc

}  // namespace viper_py
