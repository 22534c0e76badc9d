#include "cli_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/names.h"

namespace viper::cli {
namespace {

// "'VALUE' must be RULE", the message every validator returns.
std::string Refuse(std::string_view value, std::string_view rule) { return Shown(value) + " must be " + std::string(rule); }

bool HasControlBytes(std::string_view value) {
  for (unsigned char c : value)
    if (c < 0x20 || c == 0x7f) return true;
  return false;
}

// Empty if `value` is 1-max_bytes bytes without control bytes, else the refusal.
std::string CheckText(std::string_view value, size_t max_bytes, std::string_view what) {
  if (value.empty() || value.size() > max_bytes || HasControlBytes(value))
    return Refuse(value, fmt::format("{} of 1-{} bytes without control characters{}", what, max_bytes,
                                     value.size() > max_bytes ? fmt::format(" (it has {})", value.size()) : ""));
  return {};
}

bool HostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

CLI::Validator Make(std::string description, std::function<std::string(const std::string&)> check) {
  CLI::Validator v([check = std::move(check)](std::string& value) { return check(value); }, std::move(description));
  return v;
}

}  // namespace

std::string Shown(std::string_view value) {
  std::string out = "'";
  size_t shown = 0;
  for (unsigned char c : value) {
    if (shown++ == kShownBytes) break;
    if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  out += "'";
  if (value.size() > kShownBytes) out += fmt::format(" (cut; {} bytes)", value.size());
  return out;
}

CLI::Validator IntegerIn(int64_t lo, int64_t hi) {
  std::string rule = hi == INT64_MAX ? fmt::format("an integer of at least {} (decimal digits)", lo)
                                     : fmt::format("an integer from {} to {} (decimal digits)", lo, hi);
  return Make(fmt::format("INT in [{} - {}]", lo, hi), [lo, hi, rule](const std::string& value) -> std::string {
    bool negative = value.starts_with('-') && lo < 0;
    std::string_view digits(value);
    if (negative) digits.remove_prefix(1);
    if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string_view::npos)
      return Refuse(value, rule);
    int64_t parsed = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (ec != std::errc() || end != value.data() + value.size() || parsed < lo || parsed > hi) return Refuse(value, rule);
    return {};
  });
}

CLI::Validator SecondsIn(double lo, double hi, bool lo_open) {
  std::string rule = lo_open ? fmt::format("a number of seconds above {} and at most {}", lo, hi)
                             : fmt::format("a number of seconds from {} to {}", lo, hi);
  return Make(fmt::format("SECONDS in {}{} - {}]", lo_open ? "(" : "[", lo, hi),
              [lo, hi, lo_open, rule](const std::string& value) -> std::string {
                // Plain decimal notation only: no sign other than '-', no hex, inf or nan.
                if (value.empty() || value.size() > 32 ||
                    value.find_first_not_of("0123456789.-eE") != std::string::npos)
                  return Refuse(value, rule);
                double parsed = 0;
                auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
                if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(parsed) ||
                    (lo_open ? parsed <= lo : parsed < lo) || parsed > hi)
                  return Refuse(value, rule);
                return {};
              });
}

CLI::Validator ZeroOrSecondsIn(double lo, double hi) {
  CLI::Validator in_range = SecondsIn(lo, hi);
  std::string rule = fmt::format("0 (off) or a number of seconds from {} to {}", lo, hi);
  return Make(fmt::format("SECONDS: 0 or in [{} - {}]", lo, hi), [in_range, rule](const std::string& value) -> std::string {
    double parsed = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    const bool zero = value.find_first_not_of("0.") == std::string::npos && ec == std::errc() &&
                      end == value.data() + value.size() && parsed == 0;
    if (zero) return {};
    std::string copy = value;
    return in_range(copy).empty() ? std::string() : Refuse(value, rule);
  });
}

CLI::Validator Number() {
  return Make("NUMBER", [](const std::string& value) -> std::string {
    double parsed = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || value.size() > 32 || value.find_first_not_of("0123456789.-eE") != std::string::npos ||
        ec != std::errc() || end != value.data() + value.size() || !std::isfinite(parsed))
      return Refuse(value, "a finite decimal number");
    return {};
  });
}

CLI::Validator HostPort() {
  return Make("HOST:PORT", [](const std::string& value) -> std::string {
    const std::string rule = "HOST:PORT (a host name or IP address, then a port 0-65535)";
    size_t colon = value.rfind(':');
    if (value.empty() || value.size() > 300 || colon == std::string::npos || colon == 0) return Refuse(value, rule);
    std::string_view host(value.data(), colon), port(value.data() + colon + 1, value.size() - colon - 1);
    bool host_ok = host.size() <= 253;
    if (host.front() == '[') {
      host_ok = host.size() > 2 && host.back() == ']' &&
                host.substr(1, host.size() - 2).find_first_not_of("0123456789abcdefABCDEF:.") == std::string_view::npos;
    } else {
      for (char c : host) host_ok = host_ok && HostChar(c);
    }
    unsigned p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    bool port_ok = !port.empty() && port.size() <= 5 && ec == std::errc() && end == port.data() + port.size() && p <= 65535;
    return host_ok && port_ok ? std::string() : Refuse(value, rule);
  });
}

CLI::Validator ModelName() {
  return Make("NAME", [](const std::string& value) -> std::string {
    if (ValidateModelName(value).ok()) return {};
    return Refuse(value, "a model name: 1-128 bytes of [A-Za-z0-9._-], not starting with '.'");
  });
}

CLI::Validator PathText() {
  return Make("PATH", [](const std::string& value) { return CheckText(value, kMaxPathBytes, "a path"); });
}

CLI::Validator ReadableFile() {
  return Make("FILE", [](const std::string& value) -> std::string {
    if (std::string bad = CheckText(value, kMaxPathBytes, "a path"); !bad.empty()) return bad;
    struct stat st{};
    if (::stat(value.c_str(), &st) != 0) return Refuse(value, fmt::format("a readable file ({})", std::strerror(errno)));
    if (S_ISDIR(st.st_mode)) return Refuse(value, "a readable file (it is a directory)");
    if (::access(value.c_str(), R_OK) != 0) return Refuse(value, fmt::format("a readable file ({})", std::strerror(errno)));
    return {};
  });
}

CLI::Validator NewFile() {
  return Make("FILE", [](const std::string& value) -> std::string {
    if (std::string bad = CheckText(value, kMaxPathBytes, "a path"); !bad.empty()) return bad;
    const std::string rule = "a file path in an existing directory";
    struct stat st{};
    if (value.back() == '/' || (::stat(value.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
      return Refuse(value, rule + " (it is a directory)");
    std::filesystem::path dir = std::filesystem::path(value).parent_path();
    if (dir.empty()) dir = ".";
    if (::stat(dir.c_str(), &st) != 0)
      return Refuse(value, fmt::format("{} ({}: {})", rule, dir.string(), std::strerror(errno)));
    if (!S_ISDIR(st.st_mode)) return Refuse(value, fmt::format("{} ({} is not a directory)", rule, dir.string()));
    return {};
  });
}

CLI::Validator SegmentPrefix() {
  return Make("PREFIX", [](const std::string& value) -> std::string {
    bool ok = !value.empty() && value.size() <= 64;
    for (char c : value) ok = ok && (HostChar(c) && c != '.');
    return ok ? std::string() : Refuse(value, "a segment prefix: 1-64 bytes of [A-Za-z0-9_-]");
  });
}

CLI::Validator Text(size_t max_bytes) {
  return Make("TEXT", [max_bytes](const std::string& value) { return CheckText(value, max_bytes, "text"); });
}

CLI::Validator RegistryUrl() {
  return Make("URL", [](const std::string& value) -> std::string {
    if (std::string bad = CheckText(value, kMaxTextBytes, "a registry URL"); !bad.empty()) return bad;
    if (value == "embedded" || value.starts_with("redis://")) return {};
    return Refuse(value, "a registry URL: redis://HOST:PORT[/DB]");
  });
}

CLI::Validator OneOf(std::initializer_list<const char*> choices) {
  std::vector<std::string> names(choices.begin(), choices.end());
  std::string rule = "one of " + fmt::format("{}", fmt::join(names, ", "));
  return Make(fmt::format("{}", fmt::join(names, "|")), [names, rule](const std::string& value) -> std::string {
    for (const auto& n : names)
      if (value == n) return {};
    return Refuse(value, rule);
  });
}

}  // namespace viper::cli
