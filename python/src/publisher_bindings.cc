// viper._viper._Publisher and PublishResult (viper.Publisher in python/viper).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api_bindings.h"
#include <future>

namespace viper_py {

using viper::Status;
using viper::StatusCode;

namespace {

// The publisher's GpuPublisher (null before the first GPU call and after close()): the caller's own
// reference, to drop before it returns (with the GIL released: the last one waits for queued versions).
std::shared_ptr<viper::GpuPublisher> GpuOf(PublisherHandle& h) {
  std::lock_guard lock(h.gpu_mu);
  return h.gpu;
}

Status OtherDevice(int device, int started_on, const char* what) {
  return Status::InvalidArgument(std::string(what) + ": CUDA tensors on device " + std::to_string(device) +
                                 ": this publisher keeps its versions on device " + std::to_string(started_on) +
                                 " (one device per publisher)");
}

// The publisher's GpuPublisher on `device`, started at the first GPU call: one start at a time
// (gpu_start_mu), however many threads make their first call at once; gpu_mu is held only briefly,
// so that a thread holding the GIL never waits for a start. REQUIRES: GIL released.
viper::Result<std::shared_ptr<viper::GpuPublisher>> EnsureGpu(PublisherHandle& h,
                                                              const std::shared_ptr<viper::Publisher>& pub, int device,
                                                              const char* what) {
  std::lock_guard start(h.gpu_start_mu);
  {
    std::lock_guard lock(h.gpu_mu);
    if (h.gpu_closed) return Status(StatusCode::kFailedPrecondition, "Publisher is closed");
    if (h.gpu) return device == h.gpu_device ? viper::Result<std::shared_ptr<viper::GpuPublisher>>(h.gpu)
                                             : OtherDevice(device, h.gpu_device, what);
  }
  viper::gpu::DeviceVersionStore::Options o;
  o.device = device;
  auto g = viper::GpuPublisher::Start(pub.get(), o);
  if (!g.ok()) return g.status();
  std::shared_ptr<viper::Publisher> keep = pub;  // released after the GpuPublisher is gone
  std::shared_ptr<viper::GpuPublisher> started(g->release(), [keep](viper::GpuPublisher* gp) mutable {
    delete gp;
    keep.reset();
  });
  std::lock_guard lock(h.gpu_mu);
  if (h.gpu_closed) return Status(StatusCode::kFailedPrecondition, "Publisher is closed");  // `started` goes
  h.gpu = started;
  h.gpu_device = device;
  return started;
}

// Refuses a second device before any GPU work (EnsureGpu checks again under its lock).
void CheckOneDevice(PublisherHandle& h, int device, const char* what) {
  int started_on = -1;
  {
    std::lock_guard lock(h.gpu_mu);
    if (h.gpu) started_on = h.gpu_device;
  }
  if (started_on >= 0 && device != started_on) ThrowIfError(OtherDevice(device, started_on, what));
}

// A version being written in place on the GPU (Publisher.begin_cuda): the C++ draft, or nothing
// once committed or aborted. It holds its GpuPublisher until then, so that the buffer its tensors
// view stays allocated even if the Publisher is closed meanwhile (the commit then fails "closed").
struct DeviceDraftHandle {
  viper::gpu::DeviceDraft draft;
  std::shared_ptr<viper::GpuPublisher> gpu;
  uint64_t bytes = 0;  // the snapshot's size (PublishResult.bytes)
  // Ends the draft (unless committed: it was moved out) and lets go of the GpuPublisher, without
  // the GIL (the last reference waits for the versions it has queued).
  void Release() {
    py::gil_scoped_release release;
    draft = viper::gpu::DeviceDraft();
    gpu.reset();
  }
  // Python frees a draft nobody committed or aborted (garbage, or the interpreter's end) with the
  // GIL held; it may hold the last reference to a closed Publisher's GpuPublisher, whose end waits
  // for the store's thread: released here, not under the GIL.
  ~DeviceDraftHandle() {
    if ((draft.valid() || gpu) && PyGILState_Check()) Release();
  }
};

// Publisher.begin_cuda: [(name, safetensors dtype, shape)] -> a draft on `device`. The specs are
// checked (the snapshot layout's rules) before any GPU call, so a bad spec is InvalidArgument on
// every machine.
std::unique_ptr<DeviceDraftHandle> BeginDevice(PublisherHandle& h, const py::list& items, int device) {
  std::shared_ptr<viper::Publisher> pub = Held(h.publisher, "Publisher");
  std::vector<viper::TensorSpec> specs;
  for (const py::handle& item : items) {
    auto t = item.cast<py::tuple>();
    viper::TensorSpec spec;
    spec.name = t[0].cast<std::string>();
    spec.dtype = Unwrap(viper::parse_dtype(t[1].cast<std::string>()));
    spec.shape = t[2].cast<std::vector<int64_t>>();
    specs.push_back(std::move(spec));
  }
  if (specs.empty())
    ThrowIfError(Status::InvalidArgument("Publisher.begin_cuda(): no tensors: a version needs at least one"));
  auto layout = viper::SnapshotLayout::Make(specs, {}, pub->options().alignment);
  if (!layout.ok()) ThrowIfError(layout.status().WithContext("Publisher.begin_cuda()"));
  CheckOneDevice(h, device, "Publisher.begin_cuda()");
  auto out = std::make_unique<DeviceDraftHandle>();
  out->bytes = layout->total_bytes();
  viper::Result<viper::gpu::DeviceDraft> draft = Status::OK();
  {
    py::gil_scoped_release release;
    auto gpu = EnsureGpu(h, pub, device, "Publisher.begin_cuda()");
    draft = gpu.ok() ? (*gpu)->BeginDevice(specs) : viper::Result<viper::gpu::DeviceDraft>(gpu.status());
    if (draft.ok()) out->gpu = *gpu;
    gpu = Status::OK();  // our references, dropped without the GIL
    pub.reset();
  }
  if (!draft.ok()) out->Release();
  out->draft = Unwrap(std::move(draft));
  return out;
}

viper::PublishResult CommitDevice(PublisherHandle& h, DeviceDraftHandle& d, uintptr_t stream, uint64_t step,
                                  std::optional<double> loss) {
  if (!h.publisher) d.Release();  // closed: the draft can never be committed (Held raises below)
  std::shared_ptr<viper::Publisher> pub = Held(h.publisher, "Publisher");
  if (!d.draft.valid())
    ThrowIfError(Status(StatusCode::kFailedPrecondition,
                        "Publisher.begin_cuda(): the draft was already committed or aborted"));
  std::shared_ptr<viper::GpuPublisher> gpu = GpuOf(h);
  if (!gpu) {
    d.Release();  // it can never be committed: its buffer goes with its GpuPublisher
    ThrowIfError(Status(StatusCode::kFailedPrecondition, "Publisher.begin_cuda(): the publisher's GPU path is closed"));
  }
  viper::PublishInfo info;
  info.step = step;
  info.loss = loss;
  const int device = d.draft.device();
  viper::Result<uint64_t> version = Status::OK();
  const int64_t t0 = viper::WallClockNs();
  {
    py::gil_scoped_release release;
    const viper::gpu::Stream producer = viper::gpu::Stream::Borrow(device, reinterpret_cast<void*>(stream));
    version = gpu->CommitDevice(std::move(d.draft), producer, info);
    gpu.reset();  // our references, dropped without the GIL
    pub.reset();
  }
  d.Release();
  viper::PublishResult r;
  r.version = Unwrap(std::move(version));
  r.stall_ns = viper::WallClockNs() - t0;
  r.bytes = d.bytes;
  h.last_device_version = r.version;
  h.last_stall_seconds = NsToSeconds(r.stall_ns);
  return r;
}

// Publisher.publish of CUDA tensors (python/viper/_tensors.py cuda_entries).
viper::PublishResult PublishDevice(PublisherHandle& h, const py::list& items, int device, uintptr_t stream,
                                   uint64_t step, std::optional<double> loss) {
  std::shared_ptr<viper::Publisher> pub = Held(h.publisher, "Publisher");
  CheckOneDevice(h, device, "Publisher.publish()");
  std::vector<viper::gpu::DeviceTensor> tensors;
  uint64_t bytes = 0;
  for (const py::handle& item : items) {
    auto t = item.cast<py::tuple>();
    viper::gpu::DeviceTensor d;
    d.spec.name = t[0].cast<std::string>();
    d.spec.dtype = Unwrap(viper::parse_dtype(t[1].cast<std::string>()));
    d.spec.shape = t[2].cast<std::vector<int64_t>>();
    d.ptr = t[3].cast<uint64_t>();
    uint64_t n = viper::dtype_size(d.spec.dtype);
    for (int64_t dim : d.spec.shape) n *= dim > 0 ? static_cast<uint64_t>(dim) : 0;  // Make refuses a negative dim
    bytes += n;
    tensors.push_back(std::move(d));
  }
  viper::PublishInfo info;
  info.step = step;
  info.loss = loss;
  viper::Result<uint64_t> version = viper::Status::OK();
  const int64_t t0 = viper::WallClockNs();
  {
    py::gil_scoped_release release;
    auto gpu = EnsureGpu(h, pub, device, "Publisher.publish()");
    version = gpu.ok() ? (*gpu)->PublishDevice(tensors, viper::gpu::Stream::Borrow(device, reinterpret_cast<void*>(stream)), info)
                       : viper::Result<uint64_t>(gpu.status());
    gpu = Status::OK();  // our references, dropped without the GIL
    pub.reset();
  }
  viper::PublishResult r;
  r.version = Unwrap(std::move(version));
  r.stall_ns = viper::WallClockNs() - t0;
  r.bytes = bytes;
  h.last_device_version = r.version;
  h.last_stall_seconds = NsToSeconds(r.stall_ns);
  return r;
}

}  // namespace

void BindPublisher(py::module_& m) {
  py::class_<viper::PublishResult>(m, "PublishResult", "What one publish did.")
      .def_readonly("version", &viper::PublishResult::version, "The version number assigned.")
      .def_property_readonly("stall_seconds", [](const viper::PublishResult& r) { return NsToSeconds(r.stall_ns); },
                             "How long the caller was blocked.")
      .def_property_readonly("copy_seconds", [](const viper::PublishResult& r) { return NsToSeconds(r.copy_ns); },
                             "Of which copying the tensors into the segment.")
      .def_readonly("recycled", &viper::PublishResult::recycled, "The segment was recycled (the fast path).")
      .def_readonly("bytes", &viper::PublishResult::bytes, "Size of the snapshot.")
      .def("wait_delta", [](const viper::PublishResult& r, double timeout) {
             auto ms = SecondsToMs(timeout, "timeout");
             bool ready = false;
             {
               py::gil_scoped_release release;
               ready = r.delta.valid() && r.delta.wait_for(ms) == std::future_status::ready;
             }
             if (!ready) ThrowIfError(viper::Status::Timeout("the delta of version " + std::to_string(r.version) +
                                                             " was not encoded within " + std::to_string(timeout) + " s"));
             const viper::PreparedDelta& d = r.delta.get();
             py::dict out;
             out["prepared"] = d.prepared;
             out["base_version"] = d.base_version;
             out["bytes"] = d.bytes;
             out["snapshot_bytes"] = d.snapshot_bytes;
             out["why_not"] = d.why_not;
             out["encode_seconds"] = NsToSeconds(d.encode_ns);
             return out;
           }, py::arg("timeout") = 60.0,
           "The delta the node prepares for this version against the previous one, for consumers that fetch "
           "over the network: waits for its encode (in the background after the commit) and returns a dict "
           "with prepared, base_version, bytes, snapshot_bytes, encode_seconds (the encode's wall time) and why_not "
           "(why none was made).")
      .def("__repr__", [](const viper::PublishResult& r) {
        return "PublishResult(version=" + std::to_string(r.version) + ", stall_seconds=" +
               std::to_string(NsToSeconds(r.stall_ns)) + ", bytes=" + std::to_string(r.bytes) + ")";
      });

  py::class_<DeviceDraftHandle>(m, "_DeviceDraft")
      .def_property_readonly("valid", [](const DeviceDraftHandle& d) { return d.draft.valid(); },
                             "Not yet committed or aborted.")
      .def_property_readonly("device", [](const DeviceDraftHandle& d) { return d.draft.device(); })
      .def("tensors", [](const DeviceDraftHandle& d) {
             py::list out;
             if (!d.draft.valid()) return out;
             const auto& infos = d.draft.layout().tensors();  // in the order of the specs
             for (size_t k = 0; k < d.draft.tensors().size(); ++k) {
               const viper::gpu::DeviceTensor& t = d.draft.tensors()[k];
               out.append(py::make_tuple(t.spec.name, std::string(viper::dtype_name(t.spec.dtype)), t.spec.shape,
                                         static_cast<uint64_t>(t.ptr), infos[k].nbytes()));
             }
             return out;
           },
           "[(name, safetensors dtype, shape, device pointer, bytes)] of each tensor's place in the "
           "version's device buffer; empty once committed or aborted.")
      .def("abort", [](DeviceDraftHandle& d) { d.Release(); },
           "Abandons the version: nothing is announced and the buffer is free again (no work may still be "
           "writing it).");

  py::class_<PublisherHandle>(m, "_Publisher")
      .def(py::init([](viper::PublisherOptions o, std::shared_ptr<viper::Scheduler> scheduler) {
             o.scheduler = std::move(scheduler);
             auto handle = std::make_unique<PublisherHandle>();
             handle->publisher = StartWithoutGil<viper::Publisher>(o);
             return handle;
           }),
           py::arg("options"), py::arg("scheduler").none(true))
      .def("due", [](PublisherHandle& h, int64_t iteration, double loss) {
             return Unwrap(Open(h.publisher, "Publisher").Due(iteration, loss));
           })
      .def("prepare", [](PublisherHandle& h, const py::list& items, const py::dict& metadata) {
             viper::Publisher& pub = Open(h.publisher, "Publisher");
             HeldTensors held = HoldTensors(items);
             std::vector<viper::TensorSpec> specs;
             for (const auto& t : held.tensors) specs.push_back(t.spec);
             ThrowIfError(pub.Prepare(specs, StringMetadata(metadata)));
           })
      .def("publish", [](PublisherHandle& h, const py::list& items, uint64_t step, std::optional<double> loss,
                         const py::dict& metadata) {
             std::shared_ptr<viper::Publisher> pub = Held(h.publisher, "Publisher");
             HeldTensors held = HoldTensors(items);
             viper::PublishInfo info;
             info.step = step;
             info.loss = loss;
             info.metadata = StringMetadata(metadata);
             viper::Result<viper::PublishResult> result = viper::Status::OK();
             {
               py::gil_scoped_release release;
               result = pub->Publish(held.tensors, info);
               pub.reset();  // the last reference if closed meanwhile: it stops here, without the GIL
             }
             viper::PublishResult r = Unwrap(std::move(result));
             h.last_stall_seconds = NsToSeconds(r.stall_ns);
             return r;
           })
      .def("publish_device", &PublishDevice, py::arg("items"), py::arg("device"), py::arg("stream"), py::arg("step"),
           py::arg("loss").none(true),
           "CUDA tensors as (name, safetensors dtype, shape, device pointer) on `device`, written by work on "
           "`stream` (a CUstream handle, 0 = the legacy default stream): the version is kept on the GPU "
           "(GpuPublisher, started at the first call) and reaches host consumers through the host tier.")
      .def("begin_device", &BeginDevice, py::arg("items"), py::arg("device"),
           "Zero-copy GPU publish: [(name, safetensors dtype, shape)] -> a _DeviceDraft whose tensors are places "
           "in one device buffer of the version on `device` (GpuPublisher::BeginDevice).")
      .def("commit_device", &CommitDevice, py::arg("draft"), py::arg("stream"), py::arg("step"),
           py::arg("loss").none(true),
           "Publishes a _DeviceDraft written by work on `stream` (a CUstream handle, 0 = the legacy default "
           "stream), as publish_device does once its copies are queued (GpuPublisher::CommitDevice).")
      .def("wait", [](PublisherHandle& h, double timeout) {
             Open(h.publisher, "Publisher");
             ThrowIfError(WaitInSlices(timeout, [&](std::chrono::milliseconds slice) {
               std::shared_ptr<viper::Publisher> pub = Held(h.publisher, "Publisher");
               std::shared_ptr<viper::GpuPublisher> gpu = GpuOf(h);
               const uint64_t last_device = h.last_device_version;
               py::gil_scoped_release release;
               Status st = pub->Wait(slice);
               if (st.ok() && gpu && last_device != 0) st = gpu->WaitHost(last_device, slice);
               gpu.reset();
               pub.reset();
               return st;
             }));
           })
      .def_property_readonly("address", [](PublisherHandle& h) { return Open(h.publisher, "Publisher").address(); })
      .def_property_readonly("announced_version",
                             [](PublisherHandle& h) { return Open(h.publisher, "Publisher").announced_version(); })
      .def_readonly("last_stall_seconds", &PublisherHandle::last_stall_seconds)
      .def("stats", [](PublisherHandle& h) {
             viper::Publisher& pub = Open(h.publisher, "Publisher");
             py::dict d = NodeStatsDict(pub.node().stats());
             d["announced_version"] = pub.announced_version();
             d["last_stall_seconds"] = h.last_stall_seconds;
             return d;
           })
      .def("versions", [](PublisherHandle& h) {
             py::list out;
             for (const auto& info : Open(h.publisher, "Publisher").node().List()) out.append(VersionInfoDict(info));
             return out;
           })
      .def("close", [](PublisherHandle& h) {
             std::shared_ptr<viper::GpuPublisher> g;
             {
               std::lock_guard lock(h.gpu_mu);
               g = std::move(h.gpu);
               h.gpu_closed = true;
             }
             std::shared_ptr<viper::Publisher> p = std::move(h.publisher);
             py::gil_scoped_release release;
             // The last reference to each goes last: the GpuPublisher (committing its queued versions
             // on the node) before the Publisher (its deleter holds one), once no call uses them.
             g.reset();
             p.reset();  // waits for queued publishes, flushes, stops the node
           })
      .def("_abandon", [](PublisherHandle& h) {
             // No lock: gpu_mu may be held by a parent thread that does not exist in this child.
             (void)new std::shared_ptr<viper::GpuPublisher>(std::move(h.gpu));  // references never dropped
             (void)new std::shared_ptr<viper::Publisher>(std::move(h.publisher));
           },
           kAbandonDoc);
}

}  // namespace viper_py
