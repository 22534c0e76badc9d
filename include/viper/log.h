// Logging: one line per event to stderr, "viper <level> <component>: <message>".
// Level from VIPER_LOG (error|warn|info|debug; default warn) or set_log_level().
// Thread-safe. Log once, where the error is first understood.
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace viper {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view component, std::string_view message);

template <typename... Args>
void log(LogLevel level, std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_line(level, component, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace viper
