// Shared by the translation units of the `viper._viper` extension module.
//
// Error mapping (one place, so that every binding raises the same way): a failed viper::Status
// becomes a Python exception whose class subclasses the fitting builtin, so that callers can catch
// either `viper.Error` or the builtin:
//   InvalidArgument, Corruption        -> viper.InvalidArgumentError (ValueError)
//   NotFound                           -> viper.NotFoundError (LookupError, KeyError-free)
//   Timeout                            -> viper.ViperTimeoutError (TimeoutError)
//   IOError, Unavailable, PermissionDenied, ResourceExhausted -> viper.ViperIOError (OSError)
//   anything else                      -> viper.Error (RuntimeError)
// Every class also subclasses viper.Error. The message is Status::ToString(). The two classes are
// named Viper* so that `from viper import *` does not shadow the builtins TimeoutError and IOError;
// viper.TimeoutError and viper.IOError stay as aliases (not in __all__) for older callers.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

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

// Python passes times as seconds (floats); the C++ options hold integer ns or ms. InvalidArgument
// (ValueError) names `what` for a non-finite, negative, too large, or (unless allow_zero) zero value.
inline int64_t SecondsToNs(double seconds, const char* what, bool allow_zero = true) {
  if (!std::isfinite(seconds) || seconds < 0 || (!allow_zero && seconds == 0) || seconds > 9.0e9) {
    Raise(viper::Status::InvalidArgument(std::string(what) + " must be a finite number of seconds " +
                                         (allow_zero ? ">= 0" : "> 0") + ", got " + std::to_string(seconds)));
  }
  return static_cast<int64_t>(std::llround(seconds * 1e9));
}
inline std::chrono::milliseconds SecondsToMs(double seconds, const char* what) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(SecondsToNs(seconds, what)));
}
inline double NsToSeconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// For a call made without the GIL on a handle's object: checked (raising "<what> is closed") while
// the caller holds the GIL, and a reference of the call's own, so that a close() on another thread
// meanwhile leaves the object alive until the call returns. The caller drops the reference before
// it retakes the GIL: the last one then destroys the object without the GIL.
template <typename T>
std::shared_ptr<T> Held(const std::shared_ptr<T>& p, const char* what) {
  if (!p) Raise(viper::Status(viper::StatusCode::kFailedPrecondition, std::string(what) + " is closed"));
  return p;
}

// The docstring of every handle's _abandon (python/viper/__init__.py: _Handle.close in a forked child).
inline constexpr const char* kAbandonDoc =
    "In a process forked from the one that opened it: forget the parent's object without touching it (its "
    "threads and locks are the parent's; closing them here would hang or crash). Its memory is left as it is.";

inline const viper::Status& StatusOf(const viper::Status& s) { return s; }
template <typename T>
const viper::Status& StatusOf(const viper::Result<T>& r) { return r.status(); }

// A blocking wait that Ctrl-C can end: runs slice(ms) in slices of at most 100 ms until it returns
// anything but Timeout, and between slices checks for signals (raising KeyboardInterrupt's
// error_already_set); returns the last Timeout once `timeout` (seconds; nullopt: no limit) has
// passed. slice(ms) is called with the GIL held, looks its object up (so that a close() on
// another thread between slices raises "closed" instead of reaching a freed object) and releases
// the GIL for the wait itself.
template <typename Slice>
auto WaitInSlices(std::optional<double> timeout, Slice slice) -> decltype(slice(std::chrono::milliseconds(0))) {
  using Clock = std::chrono::steady_clock;
  const bool limited = timeout.has_value();
  const Clock::time_point deadline =
      limited ? Clock::now() + std::chrono::nanoseconds(SecondsToNs(*timeout, "timeout")) : Clock::time_point::max();
  while (true) {
    std::chrono::milliseconds ms(100);
    if (limited) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      ms = std::clamp(left, std::chrono::milliseconds(0), ms);
    }
    auto r = slice(ms);
    if (r.ok() || StatusOf(r).code() != viper::StatusCode::kTimeout) return r;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (limited && Clock::now() >= deadline) return r;
  }
}

// Each binds its part of the module; called once from PYBIND11_MODULE in module.cc.
void BindErrors(py::module_& m);     // module.cc: exception classes (first)
void BindSnapshot(py::module_& m);   // snapshot_bindings.cc
void BindApi(py::module_& m);        // module.cc: options, Node, Publisher, Subscriber
void BindSchedule(py::module_& m);   // schedule_bindings.cc: Scheduler, plan_schedules, ...
void BindData(py::module_& m);       // data_bindings.cc: sources, Prefetcher, RehearsalBuffer

}  // namespace viper_py
