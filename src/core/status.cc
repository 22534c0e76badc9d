#include "viper/status.h"

#include <cstring>

namespace viper {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message, int errno_value) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message), errno_value});
  }
}

Status Status::FromErrno(std::string what, int err) {
  StatusCode code = StatusCode::kIOError;
  switch (err) {
    case ENOENT: code = StatusCode::kNotFound; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    case EACCES:
    case EPERM: code = StatusCode::kPermissionDenied; break;
    case ENOMEM:
    case ENOSPC: code = StatusCode::kResourceExhausted; break;
    case ETIMEDOUT: code = StatusCode::kTimeout; break;
    case EINVAL: code = StatusCode::kInvalidArgument; break;
    default: break;
  }
  return Status(code, what + ": " + std::strerror(err), err);
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code())) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code(), std::string(context) + ": " + message(), errno_value());
}

}  // namespace viper
