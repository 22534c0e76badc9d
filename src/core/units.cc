#include "viper/units.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace viper {

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string HumanSeconds(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.0f} us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.1f} ms", seconds * 1e3);
  return fmt::format("{:.2f} s", seconds);
}

Result<uint64_t> ParseBytes(std::string_view text, std::string_view what) {
  const std::string s(text);
  const std::string named = fmt::format("{} '{}'", what, s);
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(s.c_str(), &end);
  // strtod also takes signs, spaces, "inf", "nan" and hex: a byte count is decimal ("1.7", "2e9").
  const bool plain = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.') &&
                     s.find_first_of("xX") >= static_cast<size_t>(end - s.c_str());
  if (end == s.c_str() || errno != 0 || !plain || !std::isfinite(number) || number < 0)
    return Status::InvalidArgument(named + ": expected a non-negative number with an optional suffix k, M, G, T "
                                           "(x1000) or Ki, Mi, Gi, Ti (x1024)");
  std::string suffix(end);
  if (suffix.size() > 1 && suffix.back() == 'B') suffix.pop_back();  // "MB", "MiB"
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1},     {"B", 1},      {"k", 1e3},        {"K", 1e3},           {"M", 1e6},
      {"G", 1e9},  {"T", 1e12},   {"Ki", 1024.0},    {"Mi", 1048576.0},    {"Gi", 1073741824.0},
      {"Ti", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (suffix != name) continue;
    const double exact = number * scale;
    if (exact > 0 && exact < 1) {  // rounding to 0 would turn it into the caller's "0" (often: the default)
      return Status::InvalidArgument(named + " is less than one byte; give 0 itself or at least 1 byte");
    }
    const double bytes = std::round(exact);
    if (bytes > 9007199254740992.0) return Status::InvalidArgument(named + " is too large (at most 2^53 bytes)");
    return static_cast<uint64_t>(bytes);
  }
  return Status::InvalidArgument(fmt::format("{}: unknown suffix '{}' (use k, M, G, T, Ki, Mi, Gi or Ti, optionally with B)",
                                             named, std::string(end)));
}

}  // namespace viper
