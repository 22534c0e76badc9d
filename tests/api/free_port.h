// PickFreePort: a loopback TCP port for a test's server, header-only so that any test helper
// can use it without the rest of process.h.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>

namespace viper::testing {

// A loopback port free at the time of the call, drawn at random from below the kernel's ephemeral
// range (32768-60999 by default): a port that bind(0) hands out and that is released again can be
// taken by any process's next outgoing connection before the test's server listens on it, while
// outgoing connections never take a port below that range. Another test may still draw the same
// port, so callers that listen retry when it is taken. 0 if no socket can be made.
inline uint16_t PickFreePort() {
  static thread_local std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> draw(20000, 31999);
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(draw(rng)));
    bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (free) return ntohs(addr.sin_port);
  }
}

}  // namespace viper::testing
