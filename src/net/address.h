// Socket-address helpers of the net layer (private). Thread-safe: pure functions.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "viper/status.h"

namespace viper::net::detail {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// Resolves `host` (IPv4/IPv6 literal or name) with `port` to the first stream address (IPv4
// first: UCX's TCP transports order inet before inet6 by default).
Result<SockAddr> Resolve(const std::string& host, uint16_t port);
// Every stream address `host` resolves to, IPv4 ones first, each once: what a client tries in
// turn. NotFound as Resolve.
Result<std::vector<SockAddr>> ResolveAll(const std::string& host, uint16_t port);

// "a.b.c.d:port" or "[v6]:port"; "?" for an unknown family.
std::string FormatSockAddr(const sockaddr* address);

}  // namespace viper::net::detail
