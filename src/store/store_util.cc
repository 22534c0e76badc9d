#include "store_util.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <fmt/format.h>

#include "store/file_tier.h"

namespace viper {

Status ValidateModelName(const std::string& model) {
  if (model.empty() || model.size() > 128) {
    return Status::InvalidArgument(fmt::format(
        "model name '{}' must be 1-128 characters of [A-Za-z0-9._-] (it has {})", model, model.size()));
  }
  if (model.front() == '.') {
    return Status::InvalidArgument(fmt::format("model name '{}' must not start with '.'", model));
  }
  for (char c : model) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok) {
      std::string shown = (c > 0x20 && c < 0x7f) ? fmt::format("'{}'", c)
                                                 : fmt::format("byte 0x{:02x}", static_cast<unsigned char>(c));
      return Status::InvalidArgument(
          fmt::format("model name '{}' contains {}; only [A-Za-z0-9._-] are allowed", model, shown));
    }
  }
  return Status::OK();
}

Status ValidateVersion(uint64_t version) {
  if (version == 0) {
    return Status::InvalidArgument("version 0 is not a valid version (versions start at 1; 0 means 'none' or 'latest')");
  }
  return Status::OK();
}

namespace store_internal {

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1000) return fmt::format("{} B", bytes);
  if (bytes % (1ull << 20) == 0 && bytes < (1ull << 40)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes < 1000ull * 1000) return fmt::format("{:.1f} kB", bytes / 1e3);
  if (bytes < 1000ull * 1000 * 1000) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

std::optional<uint64_t> ParseDecimal(std::string_view text) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text.front() == '0')) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0 || pid > INT_MAX) return false;
  // EPERM means the process exists but belongs to someone else: alive.
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

}  // namespace store_internal
}  // namespace viper
