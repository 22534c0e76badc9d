// Bootstrap: how two engines exchange UCX worker addresses over a plain TCP connection that
// Viper owns, before any UCX endpoint exists (private to src/net).
//
// Why not ucp_listener: UCX 1.13's TCP connection manager parses the first bytes a client sends
// itself, and a crafted message aborts the whole process (an assertion in tcp_sockcm), while
// other garbage is left open forever (docs/ARCHITECTURE.md, "The listener"). Here the node's
// listening socket is ours: a connection must send one well-formed frame within a deadline or
// it is closed, and only then does UCX see anything from that peer.
//
// Frame (both directions, one each): "VIPB" | u16 version (1) | u16 token length | u32 address
// length | token | UCX worker address; integers little-endian; token <= kMaxToken bytes,
// 1 <= address <= kMaxWorkerAddress bytes. The client sends its frame first (with its token);
// a node with a token compares it (constant time) and drops the connection on a mismatch;
// otherwise it makes the endpoint to the client's address and answers with its own frame (no
// token), then closes the connection. The token check comes first because UCX itself aborts
// the process on a malformed worker address (an assertion in ucp_address_unpack).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "address.h"
#include "viper/status.h"

namespace viper::net::detail {

inline constexpr size_t kBootstrapHeader = 12;
inline constexpr uint32_t kMaxWorkerAddress = 64 << 10;  // UCX's are a few hundred bytes
inline constexpr uint16_t kMaxToken = 4096;

struct BootstrapFrame {
  std::string token;
  std::vector<std::byte> worker_address;
};

std::vector<std::byte> EncodeBootstrapFrame(std::string_view token, std::span<const std::byte> worker_address);

// From the first kBootstrapHeader bytes: the whole frame's size, or a clear error (bad magic,
// version, reserved field, length). REQUIRES: head.size() >= kBootstrapHeader.
Result<size_t> BootstrapFrameSize(std::span<const std::byte> head);

// A whole frame (exactly its bytes) -> what it carries.
Result<BootstrapFrame> ParseBootstrapFrame(std::span<const std::byte> frame);

// Client side: connects to `to`, sends `token` and `ours`, returns the node's worker address.
// Blocks until `deadline` at most; every failure names `what`.
Result<std::vector<std::byte>> ExchangeWorkerAddresses(const SockAddr& to, std::string_view token,
                                                       std::span<const std::byte> ours,
                                                       std::chrono::steady_clock::time_point deadline,
                                                       const std::string& what);

// Node side: a listening socket and the thread that serves it. Each accepted connection must
// deliver its frame within `handshake_timeout`; then `admit(client_worker_address, peer_text)`
// runs on the acceptor thread (it makes the endpoint and returns when that is done) and, if it
// succeeded, the node's own frame is sent back. Anything else closes the connection with a
// logged reason. At most `max_pending` connections wait for their frame at once.
class Acceptor {
 public:
  using Admit = std::function<Status(std::vector<std::byte> client_address, const std::string& peer)>;
  struct Options {
    std::chrono::milliseconds handshake_timeout{5000};
    size_t max_pending = 64;
    std::string token;  // required in every frame; empty = none
  };
  static Result<std::unique_ptr<Acceptor>> Start(const SockAddr& bind_to, std::vector<std::byte> our_address,
                                                 Admit admit, Options options);
  ~Acceptor();  // stops the thread and closes every socket
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  std::string address() const;  // the bound "host:port"
  bool stopping() const;        // for admit(): give up waiting, the engine is going away

  struct Impl;

 private:
  explicit Acceptor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace viper::net::detail
