// Engine: one UCX context + worker per process, owned by a single progress thread.
//
// Every UCX call happens on the progress thread. Other threads talk to it through a command
// queue woken by an eventfd; the thread spins on ucp_worker_progress for `spin` after activity
// and then arms the worker and blocks in epoll on the worker's event fd and the queue's eventfd
// (no busy CPU when idle). Peers are endpoints created by Connect() or accepted by the listener,
// all with UCX peer-failure detection; a peer whose connection fails (process killed, network
// gone) is reported once through on_peer_closed and forgotten: nothing waits on it forever; a
// peer that disconnects gracefully says so (on_peer_closed with Unavailable on the other side).
//
// Connecting: the listener is the engine's own TCP socket, not UCX's. Connect() and the listener
// exchange worker addresses over TCP in a four-frame handshake in which each side proves that it
// holds the token without sending it (src/net/bootstrap.h); both sides then make UCX endpoints
// from the worker addresses. A listener closes, with a logged reason, any connection that does
// not complete the handshake in time or cannot prove the token, before UCX sees anything from it.
// An engine cannot connect to its own listener.
//
// Messages: control messages are UCX active messages; the engine copies them, so the caller's
// buffer is reusable when Send() returns. They arrive in the order they were sent on one peer
// (eager and rendezvous deliveries are re-ordered by the engine), up to max_message_bytes each; a
// peer that sends a larger one is closed (on_peer_closed with InvalidArgument).
//
// Bulk data uses tagged sends (rendezvous for large sizes; not put/get, which UCX emulates slowly
// over TCP). UCX matches tags per worker, not per endpoint: a RecvBulk(peer, tag) matches a
// message with `tag` from ANY peer. So tags must be unique among the receives outstanding in the
// receiving engine: the receiver chooses them (e.g. a per-engine counter in the FETCH request)
// and the sender uses them. `peer` in RecvBulk is the peer whose failure cancels the receive.
//
// Completions (SendBulk, RecvBulk, and handlers) always run on the progress thread, never inside
// the calling thread, exactly once each. "done" for SendBulk means the buffer is reusable (not
// that the peer has it); for RecvBulk it means all bytes are in the buffer. When a peer fails,
// its pending operations complete with Unavailable; after Disconnect(peer) or engine destruction,
// with Cancelled.
//
// Thread-safety: every public method may be called from any thread, including from inside a
// handler (handlers and completions run on the progress thread and must not block). The blocking
// calls (Connect, SendAndWait) return FailedPrecondition when called on the progress thread.
//
// Addresses: the listener and Connect use "HOST:PORT" (IPv4 literal, name, or [IPv6]); a node
// binds to loopback unless told otherwise. UCX settings: the engine sets a few UCX defaults (see
// src/net/engine.cc, kUcxDefaults) unless the environment already sets them (UCX_<NAME>).
// ThreadSanitizer builds need UCX_MEM_EVENTS=no in the environment (Start fails otherwise).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/names.h"
#include "viper/status.h"

namespace viper::net {

using PeerId = uint64_t;  // never reused within one Engine; 0 is never a valid peer

struct EngineOptions {
  std::string listen;                  // "HOST:PORT" to accept peers ("127.0.0.1:0" = any port); empty = no listener
  std::chrono::microseconds spin{200}; // busy-progress time after activity before blocking
  std::chrono::milliseconds connect_timeout{5000};
  // Disconnect() and destruction let in-flight sends finish for at most this long, then force.
  std::chrono::milliseconds close_timeout{1000};
  // Largest control message accepted from a peer (untrusted input); larger ones close the peer.
  size_t max_message_bytes = size_t{64} << 20;
  // Shared secret, never sent: Connect and the listener each prove they hold it by
  // challenge-response (HMAC-SHA256 over fresh nonces from both sides, bootstrap.h). A listener
  // with a token refuses any connection that cannot prove it (logged, and the client is told)
  // before UCX sees anything from that peer; Connect with a token refuses a listener that cannot
  // prove it (PermissionDenied). Empty = none proven, none required.
  std::string token;
  // A connection to the listener must send its first bootstrap frame within
  // handshake_first_frame_timeout and finish the handshake within handshake_timeout, or it is
  // closed. At most max_pending_handshakes are in progress at once (max_pending_per_address from
  // one IP): a new connection evicts the oldest beyond that, so idle or slow connections cannot
  // keep a client out (bootstrap.h).
  std::chrono::milliseconds handshake_first_frame_timeout{2000};
  std::chrono::milliseconds handshake_timeout{5000};
  size_t max_pending_handshakes = 1024;
  size_t max_pending_per_address = 128;
  // Liveness of open peers; 0 = off. A peer from which nothing came for `peer_silence` (no
  // message, no answer to a ping, no bulk receive completed, no bulk send to it completed) is
  // pinged; if it stays silent for `peer_answer` more it is failed (unless on_peer_silent keeps
  // it): on_peer_closed with Unavailable, counted in Stats::peers_silent. Every engine answers
  // pings on its progress thread (so do engines of earlier releases), busy or not; a peer whose
  // host lost power or network, or a frozen process, does not. Without this an engine learns of
  // such a peer only when TCP gives up: keepalive on an idle connection (~30 s), retransmission
  // once anything was sent to it (minutes: a node publishing every 2 s still listed a cut-off
  // relay after 255 s).
  std::chrono::milliseconds peer_silence{0};
  std::chrono::milliseconds peer_answer{5000};
  // A peer with bulk transfers pending (sends to it, receives posted for it), none of which
  // completed for `transfer_stall`, is failed (on_peer_closed with Unavailable, counted in
  // Stats::peers_stalled); 0 = never. It answers pings, so liveness keeps it; but a peer that asks
  // for bytes and never posts the receives, or announces bytes and never sends them, would hold
  // the transfers, and whatever their buffers pin, for ever. (Not for an engine whose receives
  // may legitimately wait long: a consumer's, for a version its producer is still writing.)
  std::chrono::milliseconds transfer_stall{0};
};

// Constant-time (in the length of `expected`) comparison of a presented token.
bool TokensEqual(std::string_view presented, std::string_view expected);

struct EngineHandlers {
  // A control message arrived. `bytes` is valid only during the call. May run for a peer whose
  // Connect() has not returned yet (if the listener side speaks first).
  std::function<void(PeerId, std::span<const std::byte> bytes)> on_message;
  // A listener accepted a new peer (remote address as "host:port").
  std::function<void(PeerId, const std::string& address)> on_peer_accepted;
  // The connection to a peer failed or was closed by the peer; called once per peer, after its
  // pending operations have completed with `reason` (code Unavailable, or InvalidArgument for a
  // peer that broke the protocol). Not called for Disconnect() or engine destruction.
  std::function<void(PeerId, const Status& reason)> on_peer_closed;
  // A peer left a liveness ping unanswered (EngineOptions::peer_silence): return true to fail it
  // (on_peer_closed follows), false to keep it (it is pinged again after the next silence). Unset:
  // failed.
  std::function<bool(PeerId)> on_peer_silent;
};

using Completion = std::function<void(const Status&)>;

class Engine {
 public:
  // Creates the UCX context/worker, the listener (if options.listen is set) and the thread.
  // Handlers are fixed for the engine's life. Fails with a clear Status (bad address, port in
  // use, UCX unavailable).
  static Result<std::unique_ptr<Engine>> Start(const EngineOptions& options, EngineHandlers handlers);
  // Closes endpoints (pending operations complete with Cancelled first), stops the progress
  // thread, releases UCX objects. REQUIRES: not called from a handler; no concurrent calls.
  ~Engine();
  // What the destructor does, without destroying the object: afterwards the engine's pointer
  // stays valid for other threads (an owner's worker may still call Send, which then fails with
  // NotFound, or Post, whose work never runs). Idempotent. REQUIRES: not called from a handler.
  void Stop();
  // True when called on this engine's progress thread, i.e. from one of its handlers (where Stop
  // and the destructor must not be called).
  bool OnProgressThread() const;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "HOST:PORT" the listener is bound to (the actual port if 0 was asked); empty if none.
  std::string listen_address() const;
  // Connects to a node's listener; blocks until the endpoint is usable (an engine-level ping has
  // been answered) or options.connect_timeout expires. Errors: InvalidArgument (bad address),
  // NotFound (unresolvable host), Unavailable (refused/unreachable), Timeout.
  Result<PeerId> Connect(const std::string& host_port);
  // Sends a control message (copied). NotFound if `peer` is not connected; later delivery
  // failures are reported by on_peer_closed.
  Status Send(PeerId peer, std::span<const std::byte> message);
  // Sends a control message and blocks until UCX reports it sent (locally complete: the peer may
  // not have processed it yet) or failed.
  Status SendAndWait(PeerId peer, std::span<const std::byte> message,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  // Tagged send of `bytes` to `peer` (see the tag rules above). REQUIRES: bytes stay valid and
  // unmodified until `done` runs.
  void SendBulk(PeerId peer, uint64_t tag, std::span<const std::byte> bytes, Completion done);
  // Posts a receive for a tagged message with exactly `tag` (from `peer`, see above) into
  // `buffer`. A message of another size completes with an error (Corruption if shorter,
  // InvalidArgument if longer). REQUIRES: buffer stays valid until `done` runs. `done` gets
  // Unavailable if the peer closes first.
  void RecvBulk(PeerId peer, uint64_t tag, std::span<std::byte> buffer, Completion done);
  // Closes the endpoint after in-flight sends finish (at most options.close_timeout); pending
  // receives complete with Cancelled. on_peer_closed is not called for a peer closed this way;
  // the remote side sees its on_peer_closed.
  void Disconnect(PeerId peer);
  // Runs `fn` on the progress thread, after the commands queued before it (used to order work
  // with message handling). Never runs `fn` inline, even when called on the progress thread.
  void Post(std::function<void()> fn);

  struct Stats {
    uint64_t wakeups = 0;         // times the thread woke from epoll
    uint64_t messages_in = 0;
    uint64_t messages_out = 0;
    uint64_t peers = 0;           // currently connected
    // UCX requests started and not yet completed (sends, receives, flushes, closes): 0 once every
    // operation has completed and no peer is closing.
    uint64_t requests_pending = 0;
    // Connections to the listener closed before the handshake admitted them (bootstrap.h), all
    // causes, then by cause.
    uint64_t handshakes_refused = 0;
    uint64_t handshakes_refused_token = 0;      // no token or a wrong one
    uint64_t handshakes_timed_out = 0;          // no HELLO in time, or the handshake not finished
    uint64_t handshakes_evicted = 0;            // made room for newer ones (pending caps, fds)
    uint64_t handshakes_malformed = 0;          // not the protocol, closed early, endpoint failed
    uint64_t peers_silent = 0;  // open peers failed because they did not answer a ping (peer_silence)
    uint64_t peers_stalled = 0;  // ...because bulk transfers with them made no progress (transfer_stall)
  };
  Stats stats() const;

  struct Impl;  // opaque (named here so that the implementation's helpers can refer to it)

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "HOST:PORT" syntax (core/names.h), shared with the layers that only record addresses.
using viper::ParseHostPort;
// True if the address a listener on "HOST:PORT" binds (HOST resolved as the listener resolves it)
// is a loopback address (127.0.0.0/8, ::1): only processes of this host can reach it. "0.0.0.0"
// and "::" (every interface) are not. Errors as ParseHostPort, NotFound for an unknown host.
Result<bool> IsLoopbackAddress(const std::string& host_port);
// True if HOST of "HOST:PORT" (a peer's source address, as the listener saw it) is an address of
// this host's network namespace: one a socket here can bind. A peer elsewhere cannot connect from
// one (unless net.ipv4.ip_nonlocal_bind lets any address bind: then every address reads as ours).
// Errors as ParseHostPort, NotFound for an unknown host, and the bind's own failures.
Result<bool> IsAddressOfThisHost(const std::string& host_port);

// Where other hosts reach a listener bound to `bound` ("HOST:PORT" as Engine::listen_address
// reports it): "HOST:PORT" with the bound port, and how HOST was chosen (for the node's log).
// - `host` given (a name or an address; IPv6 with or without brackets): that host. It must
//   resolve (NotFound) and must not be a wildcard or malformed (InvalidArgument).
// - else a listener on one address: that address.
// - else (0.0.0.0 or ::, every interface): this host's name, if it resolves to a non-loopback
//   address a socket here can bind; else the first non-loopback address of an interface that is
//   up (IPv4 before IPv6, link-local IPv6 skipped); else loopback (`loopback_only`: only this
//   host can reach it).
// Why: the address goes into the registry, replica lists and Publisher.address, which other
// hosts connect to; "0.0.0.0:7300" there sends each of them to its own host.
struct AdvertisedAddress {
  std::string address;
  std::string how;
  bool loopback_only = false;
};
Result<AdvertisedAddress> Advertise(const std::string& bound, const std::string& host);

}  // namespace viper::net
