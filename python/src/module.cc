// viper._viper: the C++ side of the `viper` Python package (python/viper/ is the thin Python side).
//
// What lives here: error mapping, Snapshot and ModelVersion as read-only mappings of numpy views
// (no copy: the arrays' memory is the snapshot's buffer, e.g. the node's shared-memory segment
// under the subscriber's lease, kept alive by the array's base object), and Node, Publisher and
// Subscriber handles. Tensors arrive here already as C-contiguous buffers with a safetensors dtype
// name (python/viper/_tensors.py converts numpy arrays and torch tensors).
//
// The GIL is released around every call that can block (connect, publish, wait, close); nothing
// released touches a Python object.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "options.h"
#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/scheduler.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"
#include "viper/version.h"

namespace viper_py {
namespace {

using viper::Status;
using viper::StatusCode;

// ---------------------------------------------------------------- errors

struct ErrorClasses {
  py::object base, invalid, not_found, timeout, io;
};
ErrorClasses& Errors() {
  static ErrorClasses* classes = new ErrorClasses();  // never destroyed: outlives interpreter teardown
  return *classes;
}

py::object MakeError(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  std::string qualified = std::string("viper.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  py::object obj = py::reinterpret_steal<py::object>(cls);
  m.attr(name) = obj;
  return obj;
}


// ---------------------------------------------------------------- tensors as numpy views

// numpy has no bfloat16 or float8: those come back as their raw bit patterns (uint16 / uint8);
// python/viper/_tensors.py reinterprets them for torch.
py::dtype NumpyDtype(viper::DType dtype) {
  switch (dtype) {
    case viper::DType::kF64: return py::dtype("float64");
    case viper::DType::kF32: return py::dtype("float32");
    case viper::DType::kF16: return py::dtype("float16");
    case viper::DType::kBF16: return py::dtype("uint16");
    case viper::DType::kI64: return py::dtype("int64");
    case viper::DType::kI32: return py::dtype("int32");
    case viper::DType::kI16: return py::dtype("int16");
    case viper::DType::kI8: return py::dtype("int8");
    case viper::DType::kU64: return py::dtype("uint64");
    case viper::DType::kU32: return py::dtype("uint32");
    case viper::DType::kU16: return py::dtype("uint16");
    case viper::DType::kU8: return py::dtype("uint8");
    case viper::DType::kBool: return py::dtype("bool");
    case viper::DType::kF8_E4M3: return py::dtype("uint8");
    case viper::DType::kF8_E5M2: return py::dtype("uint8");
  }
  return py::dtype("uint8");
}

// A read-only numpy array over the tensor's bytes inside `snap`; `base` keeps them alive.
py::array TensorView(const viper::Snapshot& snap, const viper::TensorInfo& tensor, py::handle base) {
  std::vector<py::ssize_t> shape(tensor.shape.begin(), tensor.shape.end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(viper::dtype_size(tensor.dtype));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<py::ssize_t>(shape[i], 1);
  }
  auto bytes = snap.tensor_data(tensor);
  py::array view(NumpyDtype(tensor.dtype), shape, strides, bytes.data(), base);
  view.attr("setflags")(py::arg("write") = false);
  return view;
}

py::dict TensorDescriptions(const viper::Snapshot& snap) {
  py::dict out;
  for (const auto& t : snap.tensors()) {
    out[py::str(t.name)] = py::make_tuple(std::string(viper::dtype_name(t.dtype)), py::tuple(py::cast(t.shape)));
  }
  return out;
}

// Both Python-facing snapshot types expose the same read-only mapping.
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
      .def_property_readonly("buffer_address", [](const Handle& h) {
        return reinterpret_cast<uintptr_t>(h.snapshot().bytes().data());
      }, "Address of the buffer the views point into (for checking where the memory lives).");
}

struct SnapshotHandle {
  viper::Snapshot snap;
  const viper::Snapshot& snapshot() const { return snap; }
};

struct VersionHandle {
  std::shared_ptr<const viper::ModelVersion> version;
  const viper::Snapshot& snapshot() const { return version->snapshot; }
};

// (name, dtype name, shape, buffer) tuples from python/viper/_tensors.py -> TensorData. The
// buffers stay referenced by `items` (held by the caller) for as long as the spans are used.
struct HeldTensors {
  std::vector<viper::TensorData> tensors;
  std::vector<py::buffer_info> buffers;
};

HeldTensors HoldTensors(const py::list& items) {
  HeldTensors held;
  held.buffers.reserve(items.size());
  for (py::handle item : items) {
    auto t = item.cast<py::tuple>();
    if (t.size() != 4) Raise(Status::InvalidArgument("internal: tensor entries are (name, dtype, shape, buffer)"));
    viper::TensorData data;
    data.spec.name = t[0].cast<std::string>();
    auto dtype = viper::parse_dtype(t[1].cast<std::string>());
    if (!dtype.ok()) Raise(dtype.status().WithContext("tensor '" + data.spec.name + "'"));
    data.spec.dtype = *dtype;
    data.spec.shape = t[2].cast<std::vector<int64_t>>();
    held.buffers.push_back(t[3].cast<py::buffer>().request());
    const py::buffer_info& info = held.buffers.back();
    uint64_t nbytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
    data.bytes = std::span<const std::byte>(static_cast<const std::byte*>(info.ptr), nbytes);
    held.tensors.push_back(std::move(data));
  }
  return held;
}

std::map<std::string, std::string> StringMetadata(const py::dict& metadata) {
  std::map<std::string, std::string> out;
  for (auto [key, value] : metadata) {
    std::string k = py::str(key);
    if (k.rfind("viper.", 0) == 0) {
      Raise(Status::InvalidArgument("metadata key '" + k + "': keys starting with 'viper.' are Viper's own"));
    }
    out[k] = py::isinstance<py::str>(value) ? value.cast<std::string>() : std::string(py::str(value));
  }
  return out;
}

// ---------------------------------------------------------------- options from keyword arguments

// Node, Publisher and Subscriber take their options as keyword arguments with the names and
// defaults of the C++ structs (options.h); the node's table is defined once and included in the
// publisher's (a Publisher embeds a node).
OptionsTable<viper::NodeOptions> NodeOptionsTable() {
  using O = viper::NodeOptions;
  OptionsTable<O> t;
  t.Plain("listen", &O::listen, "HOST:PORT to listen on; port 0 = any free port")
      .Plain("name", &O::name, "shown to peers; empty = node-<pid>")
      .Path("store_dir", &O::store_dir, "file tier directory; empty = no file tier")
      .Plain("keep_host_versions", &O::keep_host_versions, "versions per model kept in shared memory")
      .Plain("keep_file_versions", &O::keep_file_versions, "versions per model kept on the file tier")
      .Plain("token", &O::token, "shared secret every peer must present; empty = none")
      .Plain("insecure", &O::insecure, "listen beyond loopback without a token (refused otherwise)")
      .Plain("recover", &O::recover, "on start, load each model's latest file into memory")
      .Plain("chunk_bytes", &O::chunk_bytes, "bulk transfer chunk size")
      .Plain("chunks_in_flight", &O::chunks_in_flight, "bulk sends outstanding per transfer")
      .Plain("segment_prefix", &O::segment_prefix, "name prefix of the shared-memory segments")
      .Named("delta", &O::delta, viper::ParseDeltaMode, viper::delta_mode_name,
             "deltas to consumers that fetch over the network: off, auto (when smaller and faster) or always")
      .Plain("delta_bases", &O::delta_bases, "older versions per model kept as delta bases")
      .Plain("delta_threads", &O::delta_threads, "encoder threads of the node's deltas")
      .Plain("registry", &O::registry, "shared registry to register in: 'embedded' or redis://HOST:PORT[/DB]; empty = none");
  return t;
}

OptionsTable<viper::PublisherOptions> PublisherOptionsTable() {
  using O = viper::PublisherOptions;
  OptionsTable<O> t;
  t.Plain("model", &O::model, "the model's name")
      .Named("mode", &O::mode, viper::ParsePublishMode, viper::publish_mode_name,
             "async: publish() returns after the copy; sync: after the version is announced")
      .Plain("alignment", &O::alignment, "tensor alignment in the snapshot (1 = gap-free safetensors)")
      .Plain("max_in_flight", &O::max_in_flight, "async versions queued before publish() blocks")
      .Include(&O::node, NodeOptionsTable());
  return t;
}

OptionsTable<viper::SubscriberOptions> SubscriberOptionsTable() {
  using O = viper::SubscriberOptions;
  OptionsTable<O> t;
  t.Plain("model", &O::model, "the model's name")
      .Plain("connect", &O::connect, "HOST:PORT of the node (unused with a registry)")
      .Plain("registry", &O::registry, "find the node in this registry instead: 'embedded' or redis://HOST:PORT[/DB]")
      .Plain("token", &O::token, "the node's shared secret")
      .Plain("name", &O::name, "shown to the node")
      .Named("path", &O::path, viper::ParseFetchPath, viper::fetch_path_name, "auto, map, copy, remote or file")
      .Plain("verify_checksum", &O::verify_checksum, "verify bytes that crossed the network or came from a file")
      .Plain("verify_local", &O::verify_local, "also verify mapped and copied bytes of this host's node")
      .Path("file_dir", &O::file_dir, "the node's store_dir as seen from here (the file fallback)")
      .Plain("chunk_bytes", &O::chunk_bytes, "bulk transfer chunk size asked for")
      .Seconds("request_timeout", &O::request_timeout, "seconds a request to the node may take")
      .Plain("buffers", &O::buffers, "reused receive buffers kept (copy, remote and file paths)")
      .Plain("ack_on_live", &O::ack_on_live,
             "ACK each version to the node when it goes live here (False: call ack(version) once it is served)")
      .Plain("pipelined", &O::pipelined,
             "with the node on another host, also fetch versions it is still receiving, as they land")
      .Plain("delta", &O::delta, "offer the live version to the node as a delta base (remote path)");
  return t;
}

void BindOptionsClasses(py::module_& m) {
  BindOptions(m, "_NodeOptions", "viper.Node", NodeOptionsTable());
  BindOptions(m, "_PublisherOptions", "viper.Publisher", PublisherOptionsTable());
  BindOptions(m, "_SubscriberOptions", "viper.Subscriber", SubscriberOptionsTable());
}

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
template <typename T>
T& Open(const std::unique_ptr<T>& p, const char* what) {
  if (!p) Raise(Status(StatusCode::kFailedPrecondition, std::string(what) + " is closed"));
  return *p;
}

struct NodeHandle {
  std::unique_ptr<viper::Node> node;
};

struct PublisherHandle {
  std::unique_ptr<viper::Publisher> publisher;
  double last_stall_seconds = 0.0;
};

struct SubscriberHandle {
  std::unique_ptr<viper::Subscriber> subscriber;
};

py::dict VersionInfoDict(const viper::proto::VersionInfo& info) {
  py::dict d;
  d["model"] = info.model;
  d["version"] = info.version;
  d["size"] = info.size;
  d["checksum"] = viper::checksum_hex(info.checksum);
  d["step"] = info.step;
  d["publish_ns"] = info.publish_ns;
  d["completed_ns"] = info.completed_ns;
  d["metadata"] = info.metadata;
  py::list replicas;
  for (const auto& r : info.replicas) {
    const char* kind = r.kind == viper::proto::ReplicaKind::kHostSegment ? "segment"
                       : r.kind == viper::proto::ReplicaKind::kNode   ? "node"
                                                                      : "file";
    replicas.append(py::make_tuple(kind, r.locator));
  }
  d["replicas"] = replicas;
  return d;
}

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
      .def("publish", [](PublisherHandle& h, const py::list& items, uint64_t step, std::optional<double> loss,
                         const py::dict& metadata) {
             viper::Publisher& pub = Open(h.publisher, "Publisher");
             HeldTensors held = HoldTensors(items);
             viper::PublishInfo info;
             info.step = step;
             info.loss = loss;
             info.metadata = StringMetadata(metadata);
             viper::Result<viper::PublishResult> result = viper::Status::OK();
             {
               py::gil_scoped_release release;
               result = pub.Publish(held.tensors, info);
             }
             viper::PublishResult r = Unwrap(std::move(result));
             h.last_stall_seconds = NsToSeconds(r.stall_ns);
             return r;
           })
      .def("wait", [](PublisherHandle& h, double timeout) {
             viper::Publisher& pub = Open(h.publisher, "Publisher");
             auto ms = SecondsToMs(timeout, "timeout");
             Status st;
             {
               py::gil_scoped_release release;
               st = pub.Wait(ms);
             }
             ThrowIfError(st);
           })
      .def_property_readonly("address", [](PublisherHandle& h) { return Open(h.publisher, "Publisher").address(); })
      .def_property_readonly("announced_version",
                             [](PublisherHandle& h) { return Open(h.publisher, "Publisher").announced_version(); })
      .def_readonly("last_stall_seconds", &PublisherHandle::last_stall_seconds)
      .def("versions", [](PublisherHandle& h) {
             py::list out;
             for (const auto& info : Open(h.publisher, "Publisher").node().List()) out.append(VersionInfoDict(info));
             return out;
           })
      .def("close", [](PublisherHandle& h) {
             std::unique_ptr<viper::Publisher> p = std::move(h.publisher);
             py::gil_scoped_release release;
             p.reset();  // waits for queued publishes, flushes, stops the node
           });
}

void BindSubscriber(py::module_& m) {
  py::class_<VersionHandle> version(m, "ModelVersion",
                                    "One whole model version held by a subscriber: a read-only mapping name -> numpy "
                                    "view (no copy). Holding it keeps the version's memory alive.");
  BindTensorMapping<VersionHandle>(version);
  version.def_property_readonly("version", [](const VersionHandle& h) { return h.version->version(); },
                                "The version number (assigned by the producer's node, increasing).")
      .def_property_readonly("model", [](const VersionHandle& h) { return h.version->info.model; }, "The model name.")
      .def_property_readonly("step", [](const VersionHandle& h) { return h.version->info.step; },
                             "The training step the producer published it at.")
      .def_property_readonly("checksum", [](const VersionHandle& h) { return viper::checksum_hex(h.version->info.checksum); },
                             "xxh3-64 of the data region, 16 hex digits, as the node announced it.")
      .def_property_readonly("path", [](const VersionHandle& h) { return std::string(viper::fetch_path_name(h.version->path)); },
                             "The path that delivered it: map, copy, remote or file.")
      .def_property_readonly("reason", [](const VersionHandle& h) { return h.version->reason; },
                             "Why that path was chosen (and which paths failed first, if any).")
      .def_property_readonly("delta_base", [](const VersionHandle& h) { return h.version->delta_base; },
                             "The version the bytes came as a delta against; 0 if they came in full.")
      .def_property_readonly("wire_bytes", [](const VersionHandle& h) { return h.version->wire_bytes; },
                             "Bytes received from the node (the delta or the snapshot); 0 for map, copy and file.")
      .def_property_readonly("timings", [](const VersionHandle& h) {
        const viper::UpdateTimings& t = h.version->timings;
        py::dict d;
        d["publish_ns"] = t.publish_ns;
        d["completed_ns"] = t.completed_ns;
        d["notified_ns"] = t.notified_ns;
        d["fetched_ns"] = t.fetched_ns;
        d["verified_ns"] = t.verified_ns;
        d["live_ns"] = t.live_ns;
        return d;
      }, "CLOCK_REALTIME ns: publish_ns, completed_ns (at the producer's node), notified_ns, fetched_ns, verified_ns, live_ns.")
      .def("__repr__", [](const VersionHandle& h) {
        return "ModelVersion(model='" + h.version->info.model + "', version=" + std::to_string(h.version->version()) +
               ", step=" + std::to_string(h.version->info.step) + ", tensors=" +
               std::to_string(h.version->snapshot.tensors().size()) + ")";
      });

  py::class_<SubscriberHandle>(m, "_Subscriber")
      .def(py::init([](const viper::SubscriberOptions& o) {
             auto handle = std::make_unique<SubscriberHandle>();
             handle->subscriber = StartWithoutGil<viper::Subscriber>(o);
             return handle;
           }),
           py::arg("options"))
      .def("latest", [](SubscriberHandle& h) -> std::optional<VersionHandle> {
             auto v = Open(h.subscriber, "Subscriber").latest();
             if (!v) return std::nullopt;
             return VersionHandle{std::move(v)};
           })
      .def("wait_for", [](SubscriberHandle& h, uint64_t version, double timeout) {
             viper::Subscriber& sub = Open(h.subscriber, "Subscriber");
             auto ms = SecondsToMs(timeout, "timeout");
             viper::Result<std::shared_ptr<const viper::ModelVersion>> got = viper::Status::OK();
             {
               py::gil_scoped_release release;
               got = sub.WaitFor(version, ms);
             }
             return VersionHandle{Unwrap(std::move(got))};
           })
      .def("stats", [](SubscriberHandle& h) {
             viper::SubscriberStats s = Open(h.subscriber, "Subscriber").stats();
             py::dict d;
             d["notifies"] = s.notifies;
             d["updates"] = s.updates;
             d["skipped"] = s.skipped;
             d["fetch_failures"] = s.fetch_failures;
             d["deltas"] = s.deltas;
             d["delta_fallbacks"] = s.delta_fallbacks;
             return d;
           })
      .def("ack", [](SubscriberHandle& h, uint64_t version) { ThrowIfError(Open(h.subscriber, "Subscriber").Ack(version)); })
      .def("last_error", [](SubscriberHandle& h) -> std::optional<std::string> {
             Status st = Open(h.subscriber, "Subscriber").last_error();
             if (st.ok()) return std::nullopt;
             return st.ToString();
           })
      .def("close", [](SubscriberHandle& h) {
             std::unique_ptr<viper::Subscriber> s = std::move(h.subscriber);
             py::gil_scoped_release release;
             s.reset();
           });
}

void BindNode(py::module_& m) {
  py::class_<NodeHandle>(m, "_Node")
      .def(py::init([](const viper::NodeOptions& o) {
             auto handle = std::make_unique<NodeHandle>();
             handle->node = StartWithoutGil<viper::Node>(o);
             return handle;
           }),
           py::arg("options"))
      .def_property_readonly("address", [](NodeHandle& h) { return Open(h.node, "Node").address(); })
      .def("versions", [](NodeHandle& h) {
             py::list out;
             for (const auto& info : Open(h.node, "Node").List()) out.append(VersionInfoDict(info));
             return out;
           })
      .def("latest", [](NodeHandle& h, const std::string& model) -> std::optional<py::dict> {
             auto info = Open(h.node, "Node").Latest(model);
             if (!info) return std::nullopt;
             return VersionInfoDict(*info);
           })
      .def("wait_flushed", [](NodeHandle& h, double timeout) {
             viper::Node& node = Open(h.node, "Node");
             auto ms = SecondsToMs(timeout, "timeout");
             Status st;
             {
               py::gil_scoped_release release;
               st = node.WaitFlushed(ms);
             }
             ThrowIfError(st);
           })
      .def("close", [](NodeHandle& h) {
             std::unique_ptr<viper::Node> n = std::move(h.node);
             py::gil_scoped_release release;
             n.reset();
           });
}

}  // namespace

[[noreturn]] void Raise(const Status& status) {
  ErrorClasses& e = Errors();
  py::object cls;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kCorruption: cls = e.invalid; break;
    case StatusCode::kNotFound: cls = e.not_found; break;
    case StatusCode::kTimeout: cls = e.timeout; break;
    case StatusCode::kIOError:
    case StatusCode::kUnavailable:
    case StatusCode::kPermissionDenied:
    case StatusCode::kResourceExhausted: cls = e.io; break;
    default: cls = e.base; break;
  }
  PyErr_SetString(cls.ptr(), status.ToString().c_str());
  throw py::error_already_set();
}

void BindErrors(py::module_& m) {
  py::module_ builtins = py::module_::import("builtins");
  ErrorClasses& e = Errors();
  e.base = MakeError(m, "Error", py::make_tuple(builtins.attr("RuntimeError")), "Base class of every Viper error.");
  e.invalid = MakeError(m, "InvalidArgumentError", py::make_tuple(e.base, builtins.attr("ValueError")),
                        "Bad input: an option, a tensor, or bytes that fail validation (checksum, format).");
  e.not_found = MakeError(m, "NotFoundError", py::make_tuple(e.base, builtins.attr("LookupError")),
                          "A model, version, file or peer does not exist.");
  e.timeout = MakeError(m, "TimeoutError", py::make_tuple(e.base, builtins.attr("TimeoutError")),
                        "A wait expired.");
  e.io = MakeError(m, "IOError", py::make_tuple(e.base, builtins.attr("OSError")),
                   "The operating system or the network failed: connection refused, peer gone, bad token, disk.");
}

void BindSnapshot(py::module_& m) {
  py::class_<SnapshotHandle> snapshot(m, "Snapshot",
                                      "A safetensors buffer: a read-only mapping name -> numpy view (no copy).");
  BindTensorMapping<SnapshotHandle>(snapshot);
  snapshot
      .def_static("open", [](const std::string& path, bool verify) {
        viper::ParseOptions options;
        options.verify_checksum = verify;
        viper::Result<viper::Snapshot> snap = viper::Status::OK();
        {
          py::gil_scoped_release release;
          snap = viper::Snapshot::OpenFile(path, options);
        }
        if (!snap.ok() && snap.status().code() == StatusCode::kNotFound) {
          // A missing file is what Python users catch as FileNotFoundError (errno ENOENT).
          py::object error = py::module_::import("builtins").attr("FileNotFoundError")(ENOENT, snap.status().ToString(), path);
          PyErr_SetObject(error.get_type().ptr(), error.ptr());
          throw py::error_already_set();
        }
        return SnapshotHandle{Unwrap(std::move(snap))};
      }, py::arg("path"), py::arg("verify") = true,
         "Maps a safetensors file read-only and validates it (and its viper.checksum if verify and present). "
         "FileNotFoundError if it does not exist, InvalidArgumentError (ValueError) if it is malformed.")
      .def_static("from_bytes", [](py::bytes data, bool verify) {
        std::string_view view = data;
        std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(view.data()),
                                     reinterpret_cast<const std::byte*>(view.data()) + view.size());
        viper::ParseOptions options;
        options.verify_checksum = verify;
        return SnapshotHandle{Unwrap(viper::Snapshot::FromBuffer(std::move(bytes), options))};
      }, py::arg("data"), py::arg("verify") = true, "Parses (a copy of) safetensors bytes.")
      .def_static("_build", [](const py::list& items, const std::string& model, uint64_t version, uint64_t step,
                               std::optional<double> loss, const py::dict& metadata, uint64_t alignment) {
        HeldTensors held = HoldTensors(items);
        viper::VersionStamp stamp;
        stamp.model = model;
        stamp.version = version;
        stamp.step = step;
        stamp.time_ns = static_cast<uint64_t>(viper::WallClockNs());
        stamp.loss = loss;
        return SnapshotHandle{Unwrap(viper::BuildSnapshot(held.tensors, stamp, StringMetadata(metadata), alignment))};
      })
      .def("to_bytes", [](const SnapshotHandle& h) {
        auto b = h.snap.bytes();
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      }, "The whole safetensors buffer (a copy).")
      .def("save", [](const SnapshotHandle& h, const std::string& path) {
        auto b = h.snap.bytes();
        FILE* f = std::fopen(path.c_str(), "wb");
        if (f == nullptr) Raise(Status::FromErrno("open " + path + " for writing"));
        size_t written = std::fwrite(b.data(), 1, b.size(), f);
        bool ok = written == b.size() && std::fclose(f) == 0;
        if (!ok) Raise(Status::FromErrno("write " + path));
      }, py::arg("path"), "Writes the buffer to a safetensors file.")
      .def("verify", [](const SnapshotHandle& h) { ThrowIfError(h.snap.VerifyChecksum()); },
           "Raises InvalidArgumentError if viper.checksum does not match the data, NotFoundError if absent.")
      .def_property_readonly("checksum", [](const SnapshotHandle& h) -> std::optional<std::string> {
        auto c = h.snap.declared_checksum();
        if (!c) return std::nullopt;
        return viper::checksum_hex(*c);
      }, "The declared viper.checksum (16 hex digits), or None.")
      .def("__repr__", [](const SnapshotHandle& h) {
        return "Snapshot(tensors=" + std::to_string(h.snap.tensors().size()) + ", nbytes=" +
               std::to_string(h.snap.bytes().size()) + ")";
      });
}

void BindApi(py::module_& m) {
  BindOptionsClasses(m);
  BindNode(m);
  BindPublisher(m);
  BindSubscriber(m);
}

}  // namespace viper_py

PYBIND11_MODULE(_viper, m) {
  m.doc() = "C++ core of the viper package; use `import viper`.";
  m.attr("__version__") = viper::kVersionString;
  viper_py::BindErrors(m);
  viper_py::BindSnapshot(m);
  viper_py::BindApi(m);
  viper_py::BindSchedule(m);
  viper_py::BindData(m);
}
