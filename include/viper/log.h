// Logging: one line per event to stderr, "2026-11-27T04:40:01.123Z viper[PID/TID] <level> <component>: <message>"
// (UTC to the ms). Level from VIPER_LOG (error|warn|info|debug; default warn) or set_log_level(), which wins.
// Thread-safe. Log once, where the error is first understood.
//
// This header has no dependency beyond the standard library. Viper's own sources also get
// log(level, component, "{}", args...) (viper/internal/log_format.h, fmt-formatted), which is
// not part of the installed interface: fmt is a private dependency.
#pragma once

#include <string_view>

namespace viper {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view component, std::string_view message);

}  // namespace viper

// In-tree builds only (viper_core's BUILD_INTERFACE defines it): the fmt-formatted log().
#ifdef VIPER_LOG_WITH_FMT
#include "viper/internal/log_format.h"
#endif
