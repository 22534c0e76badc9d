#include "viper/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace viper {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("VIPER_LOG");
  if (env == nullptr) return LogLevel::kWarn;
  std::string_view v(env);
  if (v == "error") return LogLevel::kError;
  if (v == "info") return LogLevel::kInfo;
  if (v == "debug") return LogLevel::kDebug;
  if (v != "warn" && !v.empty()) {
    std::fprintf(stderr, "viper warn log: VIPER_LOG=%s is not one of error|warn|info|debug; using warn\n", env);
  }
  return LogLevel::kWarn;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) <= level_storage().load(std::memory_order_relaxed); }

void log_line(LogLevel level, std::string_view component, std::string_view message) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "viper %s %.*s: %.*s\n", level_name(level), static_cast<int>(component.size()),
               component.data(), static_cast<int>(message.size()), message.data());
}

}  // namespace viper
