#include "address.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cctype>
#include <cstring>
#include <fmt/format.h>

#include "net/engine.h"

namespace viper::net {
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

Result<bool> IsLoopbackAddress(const std::string& host_port) {
  VIPER_ASSIGN_OR_RETURN(auto parsed, ParseHostPort(host_port));
  VIPER_ASSIGN_OR_RETURN(detail::SockAddr addr, detail::Resolve(parsed.first, parsed.second));  // what a listener binds
  if (addr.storage.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr.storage);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.storage.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

namespace detail {

Result<SockAddr> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::NotFound(fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  SockAddr out;
  // Prefer IPv4: UCX's TCP transports order inet before inet6 by default.
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) { pick = a; break; }
  }
  std::memcpy(&out.storage, pick->ai_addr, pick->ai_addrlen);
  out.length = pick->ai_addrlen;
  freeaddrinfo(found);
  if (out.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port = htons(port);
  }
  return out;
}

std::string FormatSockAddr(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return fmt::format("{}:{}", text, ntohs(v4->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return fmt::format("[{}]:{}", text, ntohs(v6->sin6_port));
  }
  return "?";
}

}  // namespace detail
}  // namespace viper::net
