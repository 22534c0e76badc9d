// viper._viper._Subscriber and ModelVersion (viper.Subscriber in python/viper).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api_bindings.h"

namespace viper_py {

using viper::Status;
using viper::StatusCode;

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
      .def_property_readonly("device", [](const VersionHandle& h) -> py::object {
        const auto& d = h.version->device;
        if (!d) return py::none();
        py::dict out;
        out["device"] = d->device;
        out["ptr"] = d->data;
        out["bytes"] = d->bytes;
        out["in_place"] = d->in_place;
        out["how"] = d->how;
        return out;
      }, "With Subscriber(device=N): the version's data region on that GPU as a dict (device, ptr: the CUDA "
         "address of the data region, bytes, in_place, how); None otherwise. Valid while this ModelVersion is held.")
      .def("_offsets", [](const VersionHandle& h) {
        py::dict out;
        const auto& d = h.version->device;
        for (const auto& t : d ? d->tensors : h.version->snapshot.tensors())
          out[py::str(t.name)] = py::make_tuple(t.begin, t.nbytes());
        return out;
      }, "name -> (offset in the data region, bytes)")
      .def("_device_tensors", [](const VersionHandle& h) {
        py::dict out;
        if (const auto& d = h.version->device)
          for (const auto& t : d->tensors) out[py::str(t.name)] = py::make_tuple(std::string(viper::dtype_name(t.dtype)), py::tuple(py::cast(t.shape)));
        return out;
      }, "name -> (dtype, shape) of the version's GPU copy (empty without one)")
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
             Open(h.subscriber, "Subscriber");
             auto got = WaitInSlices(timeout, [&](std::chrono::milliseconds slice) {
               std::shared_ptr<viper::Subscriber> sub = Held(h.subscriber, "Subscriber");
               py::gil_scoped_release release;
               auto r = sub->WaitFor(version, slice);
               sub.reset();  // the last reference if closed meanwhile: it stops here, without the GIL
               return r;
             });
             if (!got.ok() && got.status().code() == viper::StatusCode::kTimeout) {
               auto live = Open(h.subscriber, "Subscriber").latest();
               Raise(viper::Status::Timeout("version " + std::to_string(version) + " not live within " +
                                            std::to_string(timeout) + " s (live: " +
                                            (live ? std::to_string(live->version()) : std::string("none")) + ")"));
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
             d["connect_failures"] = s.connect_failures;
             d["preferred_returns"] = s.preferred_returns;
             d["liveness_failures"] = s.liveness_failures;
             d["segments_mapped"] = s.segments_mapped;
             d["segments_reused"] = s.segments_reused;
             return d;
           })
      .def("ack", [](SubscriberHandle& h, uint64_t version) { ThrowIfError(Open(h.subscriber, "Subscriber").Ack(version)); })
      .def("last_error", [](SubscriberHandle& h) -> std::optional<std::string> {
             Status st = Open(h.subscriber, "Subscriber").last_error();
             if (st.ok()) return std::nullopt;
             return st.ToString();
           })
      .def("close", [](SubscriberHandle& h) {
             std::shared_ptr<viper::Subscriber> s = std::move(h.subscriber);
             if (!s) return;
             py::gil_scoped_release release;
             s->Close();  // a wait_for on another thread returns Cancelled, and drops the last reference
             s.reset();
           })
      .def("_abandon", [](SubscriberHandle& h) {
             (void)new std::shared_ptr<viper::Subscriber>(std::move(h.subscriber));  // a reference never dropped
           },
           kAbandonDoc);
}

}  // namespace viper_py
