#include "address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "core/fd.h"
#include "net/engine.h"

namespace viper::net {
namespace {

// 127.0.0.0/8, ::1, or v4-mapped 127/8.
bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

}  // namespace

Result<bool> IsLoopbackAddress(const std::string& host_port) {
  VIPER_ASSIGN_OR_RETURN(auto parsed, ParseHostPort(host_port));
  VIPER_ASSIGN_OR_RETURN(detail::SockAddr addr, detail::Resolve(parsed.first, parsed.second));  // what a listener binds
  return IsLoopback(addr.get());
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

namespace {

bool IsWildcard(const detail::SockAddr& a) {
  if (a.storage.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a.storage.ss_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
  return false;
}

// "HOST:PORT" of an address with `port` (brackets around IPv6).
std::string WithPort(const sockaddr* a, uint16_t port) {
  detail::SockAddr copy;
  const socklen_t length = a->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&copy.storage, a, length);
  if (a->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(&copy.storage)->sin_port = htons(port);
  else reinterpret_cast<sockaddr_in6*>(&copy.storage)->sin6_port = htons(port);
  return detail::FormatSockAddr(copy.get());
}

// The first non-loopback address this host's name resolves to that a socket here can bind.
std::string AddressOfHostName(uint16_t port, std::string* name) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == 0) return "";
  *name = host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host, nullptr, &hints, &found) != 0) return "";
  std::string out;
  for (int family : {AF_INET, AF_INET6}) {
    for (const addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
      if (a->ai_family != family || IsLoopback(a->ai_addr)) continue;
      const std::string candidate = WithPort(a->ai_addr, port);
      Result<bool> here = IsAddressOfThisHost(WithPort(a->ai_addr, 0));
      if (here.ok() && *here) out = candidate;
    }
  }
  ::freeaddrinfo(found);
  return out;
}

// The first non-loopback address of an interface that is up: IPv4, else IPv6 but link-local.
std::string AddressOfAnInterface(uint16_t port, std::string* interface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string out;
  for (int family : {AF_INET, AF_INET6}) {
    for (const ifaddrs* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP) ||
          (i->ifa_flags & IFF_LOOPBACK) || IsLoopback(i->ifa_addr))
        continue;
      if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        continue;
      out = WithPort(i->ifa_addr, port);
      *interface = i->ifa_name;
    }
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

Result<AdvertisedAddress> Advertise(const std::string& bound, const std::string& host) {
  VIPER_ASSIGN_OR_RETURN(auto listening, ParseHostPort(bound));
  const uint16_t port = listening.second;
  if (!host.empty()) {
    const bool bracketed = host.front() == '[';
    const std::string literal = !bracketed && host.find(':') != std::string::npos ? "[" + host + "]" : host;
    auto parsed = ParseHostPort(literal + ":" + std::to_string(port));
    if (!parsed.ok()) return parsed.status().WithContext("advertised host '" + host + "'");
    VIPER_ASSIGN_OR_RETURN(detail::SockAddr resolved, detail::Resolve(parsed->first, port));
    if (IsWildcard(resolved))
      return Status::InvalidArgument("advertised host '" + host + "' is a wildcard: name the address other hosts reach");
    return AdvertisedAddress{literal + ":" + std::to_string(port), "as told", IsLoopback(resolved.get())};
  }
  VIPER_ASSIGN_OR_RETURN(detail::SockAddr bound_address, detail::Resolve(listening.first, port));
  if (!IsWildcard(bound_address)) return AdvertisedAddress{bound, "the listen address", IsLoopback(bound_address.get())};
  std::string name, interface;
  if (std::string a = AddressOfHostName(port, &name); !a.empty())
    return AdvertisedAddress{a, "this host's name " + name + " resolves to it", false};
  if (std::string a = AddressOfAnInterface(port, &interface); !a.empty())
    return AdvertisedAddress{a, "the first address of interface " + interface +
                                    (name.empty() ? "" : " (the host name " + name + " resolves to no non-loopback address of this host)"),
                             false};
  const bool v6 = bound_address.storage.ss_family == AF_INET6;
  return AdvertisedAddress{fmt::format("{}:{}", v6 ? "[::1]" : "127.0.0.1", port),
                           "loopback: this host has no other address that is up", true};
}

namespace detail {

Result<std::vector<SockAddr>> ResolveAll(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::NotFound(fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  std::vector<SockAddr> out;
  for (int family : {AF_INET, AF_INET6}) {
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      if (a->ai_family != family || a->ai_addrlen > sizeof(sockaddr_storage)) continue;
      SockAddr s;
      std::memcpy(&s.storage, a->ai_addr, a->ai_addrlen);
      s.length = a->ai_addrlen;
      if (family == AF_INET) reinterpret_cast<sockaddr_in*>(&s.storage)->sin_port = htons(port);
      else reinterpret_cast<sockaddr_in6*>(&s.storage)->sin6_port = htons(port);
      const bool seen = std::any_of(out.begin(), out.end(), [&](const SockAddr& o) {
        return o.length == s.length && std::memcmp(&o.storage, &s.storage, s.length) == 0;
      });
      if (!seen) out.push_back(s);
    }
  }
  freeaddrinfo(found);
  if (out.empty()) return Status::NotFound(fmt::format("cannot resolve host '{}': no IPv4 or IPv6 address", host));
  return out;
}

Result<SockAddr> Resolve(const std::string& host, uint16_t port) {
  VIPER_ASSIGN_OR_RETURN(std::vector<SockAddr> all, ResolveAll(host, port));
  return all.front();
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
