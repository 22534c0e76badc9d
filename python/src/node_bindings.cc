// viper._viper._Node: a standalone node (viper.Node in python/viper), and the catalog entries it lists.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <limits>

#include "api_bindings.h"
#include "core/token_file.h"
#include "viper/log.h"
#include "viper/metrics.h"

namespace viper_py {

using viper::Status;
using viper::StatusCode;

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

py::dict NodeStatsDict(const viper::NodeStats& stats) {
  const auto counters = viper::StatsCounters(stats);
  py::dict d;
  for (const auto& [name, value] : counters)
    if (!viper::IsHistogramCounter(name)) d[py::str(name)] = value;
  py::dict histograms;
  for (const viper::NamedHistogram& h : viper::HistogramsFromCounters(counters)) {
    py::list buckets;
    uint64_t cumulative = 0;
    for (const auto& [bound, count] : h.buckets) {
      cumulative += count;
      double le = bound == UINT64_MAX ? std::numeric_limits<double>::infinity() : static_cast<double>(bound) / 1e6;
      buckets.append(py::make_tuple(le, cumulative));
    }
    py::dict one;
    one["buckets"] = buckets;
    one["count"] = cumulative;
    one["sum_seconds"] = static_cast<double>(h.sum_us) / 1e6;
    histograms[py::str(h.name)] = one;
  }
  d["histograms"] = histograms;
  return d;
}

void BindNode(py::module_& m) {
  m.def("_set_log_level", [](int level) { viper::set_log_level(static_cast<viper::LogLevel>(level)); });
  m.def("_log_level", [] { return static_cast<int>(viper::log_level()); });
  m.def("_resolve_token", [](const std::string& token_file) { return Unwrap(viper::ResolveToken(token_file)); },
        py::arg("token_file"),
        "The token from token_file if named, else $VIPER_TOKEN, else ''; the viper command's rule (an "
        "owner-only file of one line).");
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
      .def("stats", [](NodeHandle& h) { return NodeStatsDict(Open(h.node, "Node").stats()); })
      .def("wait_flushed", [](NodeHandle& h, double timeout) {
             Open(h.node, "Node");
             ThrowIfError(WaitInSlices(timeout, [&](std::chrono::milliseconds slice) {
               std::shared_ptr<viper::Node> node = Held(h.node, "Node");
               py::gil_scoped_release release;
               Status st = node->WaitFlushed(slice);
               node.reset();
               return st;
             }));
           })
      .def("close", [](NodeHandle& h) {
             std::shared_ptr<viper::Node> n = std::move(h.node);
             py::gil_scoped_release release;
             n.reset();
           })
      .def("_abandon", [](NodeHandle& h) {
             (void)new std::shared_ptr<viper::Node>(std::move(h.node));  // a reference never dropped
           },
           kAbandonDoc);
}

}  // namespace viper_py
