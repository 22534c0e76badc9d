#include "core/names.h"

#include <arpa/inet.h>

#include <cctype>

#include <fmt/format.h>

namespace viper {
namespace {

Result<uint16_t> ParsePort(const std::string& text, const std::string& whole) {
  if (text.empty()) return Status::InvalidArgument(fmt::format("address '{}': missing port after ':'", whole));
  if (text.size() > 5) {
    return Status::InvalidArgument(fmt::format("address '{}': port '{}' is not a number in 0-65535", whole, text));
  }
  uint32_t port = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      return Status::InvalidArgument(fmt::format("address '{}': port '{}' is not a number", whole, text));
    }
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) {
    return Status::InvalidArgument(fmt::format("address '{}': port {} is larger than 65535", whole, port));
  }
  return static_cast<uint16_t>(port);
}

// Host names and IPv4 literals: letters, digits, '.', '-', '_'.
bool ValidHostName(const std::string& host) {
  for (char c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') return false;
  }
  return true;
}

}  // namespace

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

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port) {
  if (host_port.empty()) return Status::InvalidArgument("address is empty; expected HOST:PORT");
  std::string host;
  std::string port_text;
  if (host_port.front() == '[') {  // [IPv6]:port
    size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() || host_port[close + 1] != ':') {
      return Status::InvalidArgument(fmt::format("address '{}': expected [IPV6]:PORT", host_port));
    }
    host = host_port.substr(1, close - 1);
    port_text = host_port.substr(close + 2);
    in6_addr probe{};
    if (inet_pton(AF_INET6, host.c_str(), &probe) != 1) {
      return Status::InvalidArgument(fmt::format("address '{}': '{}' is not an IPv6 address", host_port, host));
    }
  } else {
    size_t colon = host_port.rfind(':');
    if (colon == std::string::npos) {
      return Status::InvalidArgument(fmt::format("address '{}': missing ':PORT'", host_port));
    }
    host = host_port.substr(0, colon);
    port_text = host_port.substr(colon + 1);
    if (host.empty()) return Status::InvalidArgument(fmt::format("address '{}': empty host before ':'", host_port));
    if (!ValidHostName(host)) {
      return Status::InvalidArgument(fmt::format(
          "address '{}': host '{}' has characters not allowed in a name or IPv4 address", host_port, host));
    }
  }
  if (host.empty()) return Status::InvalidArgument(fmt::format("address '{}': empty host", host_port));
  VIPER_ASSIGN_OR_RETURN(uint16_t port, ParsePort(port_text, host_port));
  return std::make_pair(std::move(host), port);
}

}  // namespace viper
