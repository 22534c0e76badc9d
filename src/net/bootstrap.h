// Bootstrap: how two engines exchange UCX worker addresses over a plain TCP connection that
// Viper owns, before any UCX endpoint exists (private to src/net).
//
// Why not ucp_listener: UCX 1.13's TCP connection manager parses the first bytes a client sends
// itself, and a crafted message aborts the whole process (an assertion in tcp_sockcm), while
// other garbage is left open forever (docs/ARCHITECTURE.md, "The listener"). Here the node's
// listening socket is ours: a connection must complete the handshake below within deadlines or
// it is closed, and only then does UCX see anything from that peer.
//
// Handshake (version 3, docs/PROTOCOL.md "Bootstrap"): four frames, the token never crosses the
// wire, and the node's worker address only goes to a client that proved it (or to anyone when
// the node holds no token). Every frame is "VIPB" | u16 version | u8 type | u8 flags | u32 body
// length | body, integers little-endian.
//   1. client -> node  HELLO      body: nonce_c (32 bytes); flag kHasToken: the client holds one.
//   2. node -> client  CHALLENGE  body: nonce_n (32) | [node proof (32) if kHasToken]. Or a
//                                 RESULT refusal (a node with a token refuses a client that says
//                                 it holds none).
//   3. client -> node  PROOF      body: [client proof (32) if kHasToken] | client's worker address.
//                                 A client with a token sends this only after the node's proof
//                                 verified: it knows it reached a node of its fleet first.
//   4. node -> client  RESULT     body: u8 code | short text (a refusal), or, accepted (code 0):
//                                 u8 0 | [address proof (32) if kHasToken] | node's worker
//                                 address. Sent after the node made its endpoint to the client.
// node proof    = HMAC-SHA256(token, "viper-bootstrap-v3 node"    | nonce_c | nonce_n)
// client proof  = HMAC-SHA256(token, "viper-bootstrap-v3 client"  | nonce_c | nonce_n | len | client address)
// address proof = HMAC-SHA256(token, "viper-bootstrap-v3 address" | nonce_c | nonce_n | len | client address
//                                                                  | len | node address)
// (len: u32 little-endian), compared in constant time. The role labels keep one proof from being
// replayed as another; fresh nonces from both sides keep old proofs from being replayed; the
// worker addresses are bound into the proofs so that nobody between the two can substitute its
// own. Why the node's address waits for the client's proof (version 2 sent it in the CHALLENGE):
// UCX matches tagged messages from any endpoint, including one that never passed this
// handshake, and keeps unmatched ones in memory; whoever has the address can open an endpoint.
// Without a token on either side no proof is sent or checked. The node verifies the client's
// proof before the client's worker address reaches UCX, because UCX aborts the process on a
// malformed worker address (an assertion in ucp_address_unpack); the address is also checked by
// CheckUcxWorkerAddress (ucx_address.h) either way.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "address.h"
#include "../core/crypto.h"
#include "viper/status.h"

namespace viper::net::detail {

inline constexpr size_t kBootstrapHeader = 12;
inline constexpr uint16_t kBootstrapVersion = 3;
inline constexpr size_t kNonceSize = 32;
inline constexpr uint32_t kMaxWorkerAddress = 64 << 10;  // UCX's are a few hundred bytes
inline constexpr uint32_t kMaxResultText = 256;
inline constexpr uint32_t kMaxBootstrapBody = 1 + crypto::kMacSize + kMaxWorkerAddress;  // an accepted RESULT

enum class FrameType : uint8_t { kHello = 1, kChallenge = 2, kProof = 3, kResult = 4 };
inline constexpr uint8_t kHasToken = 1;  // the only flag (a RESULT: it carries the address proof)

// RESULT codes. What a refused client is told, no more: nothing here helps a guesser.
enum class ResultCode : uint8_t {
  kAccepted = 0,
  kTokenRequired = 1,  // the node requires a token and the client holds none
  kWrongToken = 2,     // the client's proof does not match the node's token
  kBusy = 3,           // the node dropped the connection to make room for others
  kRejected = 4,       // anything else (text says what: protocol version, own listener, ...)
};
std::string_view ResultCodeText(ResultCode code);

using Nonce = std::array<std::byte, kNonceSize>;

struct BootstrapFrame {
  FrameType type{};
  uint8_t flags = 0;
  std::vector<std::byte> body;
};

std::vector<std::byte> EncodeBootstrapFrame(FrameType type, uint8_t flags, std::span<const std::byte> body);

// From the first kBootstrapHeader bytes: the whole frame's size, or a clear error (bad magic,
// version, type, flags, length for its type). REQUIRES: head.size() >= kBootstrapHeader.
Result<size_t> BootstrapFrameSize(std::span<const std::byte> head);

// A whole frame (exactly its bytes) -> its parts. The body's layout is checked by the typed
// decoders below.
Result<BootstrapFrame> ParseBootstrapFrame(std::span<const std::byte> frame);

struct Hello {
  Nonce nonce{};
  bool has_token = false;
};
struct Challenge {
  Nonce nonce{};
  std::optional<crypto::Mac> proof;
};
struct Proof {
  std::optional<crypto::Mac> proof;
  std::vector<std::byte> client_address;
};
struct BootstrapResult {
  ResultCode code = ResultCode::kAccepted;
  std::string text;                          // a refusal's (code != 0)
  std::optional<crypto::Mac> address_proof;  // accepted, by a node with a token
  std::vector<std::byte> node_address;       // accepted: 1..kMaxWorkerAddress bytes
};

std::vector<std::byte> EncodeHello(const Hello& m);
std::vector<std::byte> EncodeChallenge(const Challenge& m);
std::vector<std::byte> EncodeProof(const Proof& m);
std::vector<std::byte> EncodeResult(const BootstrapResult& m);
// Each fails (InvalidArgument naming the rule) on a frame of another type or a bad body.
Result<Hello> DecodeHello(const BootstrapFrame& f);
Result<Challenge> DecodeChallenge(const BootstrapFrame& f);
Result<Proof> DecodeProof(const BootstrapFrame& f);
Result<BootstrapResult> DecodeResult(const BootstrapFrame& f);

crypto::Mac NodeProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce);
crypto::Mac ClientProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce,
                        std::span<const std::byte> client_address);
crypto::Mac AddressProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce,
                         std::span<const std::byte> client_address, std::span<const std::byte> node_address);

// Client side: connects to the first of `to` (the addresses a host name resolves to, in order)
// that accepts a TCP connection, runs the handshake with `token` (empty = none) and `ours`,
// returns the node's worker address once the node accepted us. Blocks until `deadline` at most;
// every failure names `what`; a refusal is PermissionDenied (token) or Unavailable (busy, other)
// with "refused by HOST:PORT: <reason>"; a node that cannot prove the token is PermissionDenied.
// REQUIRES: `to` is not empty.
Result<std::vector<std::byte>> ExchangeWorkerAddresses(std::span<const SockAddr> to, std::string_view token,
                                                       std::span<const std::byte> ours,
                                                       std::chrono::steady_clock::time_point deadline,
                                                       const std::string& what);

// Node side: a listening socket and the thread that serves it (epoll over the listener and every
// pending connection, all non-blocking: a pending connection never delays another or the
// accept). A connection must deliver its HELLO within `first_frame_timeout` and finish the
// handshake within `handshake_timeout`; then `admit(client_worker_address, peer_text)` runs on
// the acceptor thread (it makes the endpoint and returns when that is done) and the RESULT is
// sent. At most `max_pending` connections are in the handshake at once, at most
// `max_pending_per_address` from one IP address: a new connection over either cap evicts the
// oldest pending one (of that address, or of all), so accepting never stops. Every connection
// closed before it was admitted is counted (refused()) and logged with its peer's address,
// rate-limited.
class Acceptor {
 public:
  using Admit = std::function<Status(std::vector<std::byte> client_address, const std::string& peer)>;
  struct Options {
    std::chrono::milliseconds first_frame_timeout{2000};
    std::chrono::milliseconds handshake_timeout{5000};
    size_t max_pending = 1024;             // lowered to a quarter of RLIMIT_NOFILE's soft limit
    size_t max_pending_per_address = 128;  // per source IP address
    std::string token;                     // proven in every handshake; empty = none
  };
  // Shared with the owner, which may read them after the Acceptor is gone.
  struct Counters {
    std::atomic<uint64_t> accepted{0};   // connections admitted (an endpoint made)
    std::atomic<uint64_t> auth{0};       // refused for the token (none, wrong)
    std::atomic<uint64_t> timed_out{0};  // ...for a deadline
    std::atomic<uint64_t> evicted{0};    // ...to make room under a cap
    std::atomic<uint64_t> malformed{0};  // ...for a malformed frame, a closed or failed socket, admit failing
    uint64_t refused() const { return auth.load() + timed_out.load() + evicted.load() + malformed.load(); }
  };
  static Result<std::unique_ptr<Acceptor>> Start(const SockAddr& bind_to, std::vector<std::byte> our_address,
                                                 Admit admit, Options options);
  ~Acceptor();  // stops the thread and closes every socket
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  std::string address() const;  // the bound "host:port"
  bool stopping() const;        // for admit(): give up waiting, the engine is going away
  std::shared_ptr<const Counters> counters() const;  // any thread

  struct Impl;

 private:
  explicit Acceptor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace viper::net::detail
