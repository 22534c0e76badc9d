#include "address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "core/fd.h"
#include "net/engine.h"

namespace viper::net {

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

Result<bool> IsAddressOfThisHost(const std::string& host_port) {
  VIPER_ASSIGN_OR_RETURN(auto parsed, ParseHostPort(host_port));
  VIPER_ASSIGN_OR_RETURN(detail::SockAddr addr, detail::Resolve(parsed.first, 0));
  Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno("socket to check " + host_port);
  if (::bind(fd.get(), addr.get(), addr.length) == 0) return true;
  if (errno == EADDRNOTAVAIL) return false;
  return Status::FromErrno("bind to check whether " + host_port + " is this host's");
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
