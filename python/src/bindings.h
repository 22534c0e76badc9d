// Shared by the translation units of the `viper._viper` extension module.
//
// Error mapping (one place, so that every binding raises the same way): a failed viper::Status
// becomes a Python exception whose class subclasses the fitting builtin, so that callers can catch
// either `viper.Error` or the builtin:
//   InvalidArgument, Corruption        -> viper.InvalidArgumentError (ValueError)
//   NotFound                           -> viper.NotFoundError (LookupError, KeyError-free)
//   Timeout                            -> viper.TimeoutError (TimeoutError)
//   IOError, Unavailable, PermissionDenied, ResourceExhausted -> viper.IOError (OSError)
//   anything else                      -> viper.Error (RuntimeError)
// Every class also subclasses viper.Error. The message is Status::ToString().
#pragma once

#include <pybind11/pybind11.h>

#include "viper/status.h"

namespace viper_py {

namespace py = pybind11;

// Raises the mapped Python exception. REQUIRES: the GIL is held; !status.ok().
[[noreturn]] void Raise(const viper::Status& status);

inline void ThrowIfError(const viper::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Unwrap(viper::Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// Each binds its part of the module; called once from PYBIND11_MODULE in module.cc.
void BindErrors(py::module_& m);     // module.cc: exception classes (first)
void BindSnapshot(py::module_& m);   // module.cc
void BindApi(py::module_& m);        // module.cc: Node, Publisher, Subscriber
void BindSchedule(py::module_& m);   // schedule_bindings.cc: Scheduler, plan_schedules, ...

}  // namespace viper_py
