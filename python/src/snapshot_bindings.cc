// viper._viper.Snapshot: a safetensors buffer as a read-only mapping of numpy views.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api_bindings.h"
#include <cerrno>
#include <cstdio>

namespace viper_py {

using viper::Status;
using viper::StatusCode;

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
          PyErr_SetObject(py::type::handle_of(error).ptr(), error.ptr());
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
  m.def("_first_in_viewed_buffer", &FirstInViewedBuffer, py::arg("ranges"),
        "Internal (load_into): the index of the first (address, nbytes) range that overlaps the buffer of a live "
        "Snapshot or ModelVersion (read-only views), or -1.");
}

}  // namespace viper_py
