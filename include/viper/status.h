// Status and Result<T>: errors are values that cannot be ignored and that explain themselves.
//
// A Status is OK or carries a code, a message naming what failed and why, and the errno that
// caused it (0 if none). Result<T> holds either a T or a non-OK Status. Both are [[nodiscard]].
// Thread-safety: values; no shared state.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace viper {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong (bad option, malformed bytes, bad file)
  kCorruption,       // stored or received bytes fail validation (checksum, structure)
  kNotFound,         // model, version, file, segment or peer does not exist
  kAlreadyExists,
  kIOError,          // an operating-system call failed (errno attached)
  kTimeout,
  kUnavailable,      // peer gone, connection refused, node shutting down
  kPermissionDenied, // bad token, refused peer
  kResourceExhausted,
  kNotSupported,     // a backend cannot do this verb
  kFailedPrecondition,
  kCancelled,
  kInternal,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, int errno_value = 0);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status Timeout(std::string msg) { return {StatusCode::kTimeout, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) { return {StatusCode::kPermissionDenied, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status NotSupported(std::string msg) { return {StatusCode::kNotSupported, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  // "<what>: <strerror(err)>" with the errno kept; code chosen from err (ENOENT -> NotFound, ...).
  static Status FromErrno(std::string what, int err = errno);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  int errno_value() const { return state_ ? state_->errno_value : 0; }
  // "InvalidArgument: <message>" or "OK".
  std::string ToString() const;
  // A copy whose message is "<context>: <message>", same code and errno.
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
    int errno_value;
  };
  std::shared_ptr<const State> state_;  // null means OK; shared so copies are cheap
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : storage_(std::move(status)) {  // NOLINT
    if (std::get<Status>(storage_).ok()) storage_ = Status::Internal("Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(storage_); }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(storage_);
  }
  Status status() && { return ok() ? Status() : std::get<Status>(std::move(storage_)); }

  // REQUIRES: ok()
  T& value() & { return std::get<T>(storage_); }
  const T& value() const& { return std::get<T>(storage_); }
  T&& value() && { return std::get<T>(std::move(storage_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> storage_;
};

namespace internal {
inline Status to_status(Status s) { return s; }
template <typename T>
Status to_status(const Result<T>& r) { return r.status(); }
}  // namespace internal

}  // namespace viper

#define VIPER_CONCAT_INNER(a, b) a##b
#define VIPER_CONCAT(a, b) VIPER_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (Status or Result) is not OK.
#define VIPER_RETURN_IF_ERROR(expr)                                           \
  do {                                                                        \
    ::viper::Status _viper_st = ::viper::internal::to_status((expr));         \
    if (!_viper_st.ok()) return _viper_st;                                    \
  } while (0)

// `VIPER_ASSIGN_OR_RETURN(auto x, f())`: binds the value of Result `f()` or returns its Status.
#define VIPER_ASSIGN_OR_RETURN(lhs, rexpr) \
  VIPER_ASSIGN_OR_RETURN_IMPL(VIPER_CONCAT(_viper_result_, __LINE__), lhs, rexpr)
#define VIPER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
