#include "viper/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
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
    log_line(LogLevel::kWarn, "log", std::string("VIPER_LOG=") + env + " is not one of error|warn|info|debug; using warn");
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

// "2026-11-27T04:40:01.123Z viper[PID/TID] LEVEL COMPONENT: MESSAGE": UTC to the millisecond,
// the process and the kernel's thread id (as top -H and /proc/PID/task show it).
void log_line(LogLevel level, std::string_view component, std::string_view message) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  ::gmtime_r(&now.tv_sec, &utc);
  char stamp[96];  // room for any int fields (the compiler's bound), 24 bytes in practice
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(now.tv_nsec / 1000000));
  static thread_local const long tid = ::syscall(SYS_gettid);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s viper[%ld/%ld] %s %.*s: %.*s\n", stamp, static_cast<long>(::getpid()), tid,
               level_name(level), static_cast<int>(component.size()), component.data(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace viper
