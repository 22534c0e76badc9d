// viper::log(level, component, format, args...): the fmt-formatted form of log_line(), for
// Viper's own sources. Not installed: fmt is a private dependency of the libraries, so the
// installed viper/log.h stops at the fmt-free declarations. In-tree targets get this header
// through viper/log.h, because viper_core defines VIPER_LOG_WITH_FMT for them only
// ($<BUILD_INTERFACE:...> in src/core/CMakeLists.txt).
#pragma once

#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "viper/log.h"

namespace viper {

template <typename... Args>
void log(LogLevel level, std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_line(level, component, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace viper
