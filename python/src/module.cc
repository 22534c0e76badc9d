// viper._viper: the C++ side of the `viper` Python package (python/viper/ is the thin Python side).
//
// What lives here: the error mapping and the module's entry point. One file per bound class
// beside it: snapshot_bindings.cc (Snapshot), node_bindings.cc, publisher_bindings.cc,
// subscriber_bindings.cc (ModelVersion), schedule_bindings.cc, data_bindings.cc; tensor_views.cc
// makes snapshots read-only numpy views (no copy: the arrays' memory is the snapshot's buffer,
// e.g. the node's shared-memory segment under the subscriber's lease, kept alive by the array's
// base object); options_bindings.cc holds the options tables. Tensors arrive already as
// C-contiguous buffers with a safetensors dtype name (python/viper/_tensors.py converts numpy
// arrays and torch tensors).
//
// The GIL is released around every call that can block (connect, publish, wait, close); nothing
// released touches a Python object.
#include <pybind11/pybind11.h>

#include <string>

#include "api_bindings.h"
#include "bindings.h"
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
  // A message may quote bytes that are not UTF-8 (a model name given as b"\xff"): shown as \xNN,
  // never an exception with an empty message.
  const std::string text = status.ToString();
  py::object message = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace"));
  PyErr_SetObject(cls.ptr(), message.ptr());
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
  e.timeout = MakeError(m, "ViperTimeoutError", py::make_tuple(e.base, builtins.attr("TimeoutError")),
                        "A wait expired (subclasses the builtin TimeoutError; the old name viper.TimeoutError is "
                        "kept as an alias outside __all__).");
  e.io = MakeError(m, "ViperIOError", py::make_tuple(e.base, builtins.attr("OSError")),
                   "The operating system or the network failed: connection refused, peer gone, bad token, disk "
                   "(subclasses OSError; the old name viper.IOError is kept as an alias outside __all__).");
  // The former names, kept for older callers; python/viper leaves them out of __all__ so that
  // `from viper import *` does not shadow the builtins.
  m.attr("TimeoutError") = e.timeout;
  m.attr("IOError") = e.io;
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
