// Engine: one UCX context + worker per process, owned by a single progress thread.
//
// Every UCX call happens on the progress thread. Other threads talk to it through a command
// queue woken by an eventfd; the thread spins on ucp_worker_progress for `spin_us` after activity
// and then blocks in epoll on the worker's event fd and the queue's eventfd (no busy CPU when
// idle). Peers are endpoints created by connect() or accepted by the listener; a peer whose
// connection fails (process killed, network gone) is reported once through on_peer_closed and
// forgotten: nothing waits on it forever.
//
// Messages: small control messages are UCX active messages (id kControlAmId); the engine copies
// them, so the caller's buffer is reusable when send() returns. Bulk data uses tagged sends with
// rendezvous (not put/get, which UCX emulates slowly over TCP): send_bulk/recv_bulk complete
// through callbacks on the progress thread, and "done" for send_bulk means the buffer is
// reusable; for recv_bulk it means the bytes are in the buffer.
//
// Thread-safety: every public method may be called from any thread, including from inside a
// handler (handlers run on the progress thread and must not block).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "viper/status.h"

namespace viper::net {

using PeerId = uint64_t;  // never reused within one Engine; 0 is never a valid peer

struct EngineOptions {
  std::string listen;                  // "HOST:PORT" to accept peers ("127.0.0.1:0" = any port); empty = no listener
  std::chrono::microseconds spin{200}; // busy-progress time after activity before blocking
  std::chrono::milliseconds connect_timeout{5000};
};

struct EngineHandlers {
  // A control message arrived. `bytes` is valid only during the call.
  std::function<void(PeerId, std::span<const std::byte> bytes)> on_message;
  // A listener accepted a new peer (remote address as "host:port").
  std::function<void(PeerId, const std::string& address)> on_peer_accepted;
  // The connection to a peer failed or was closed; called once per peer.
  std::function<void(PeerId, const Status& reason)> on_peer_closed;
};

using Completion = std::function<void(const Status&)>;

class Engine {
 public:
  // Creates the UCX context/worker, the listener (if options.listen is set) and the thread.
  // Handlers are fixed for the engine's life.
  static Result<std::unique_ptr<Engine>> Start(const EngineOptions& options, EngineHandlers handlers);
  ~Engine();  // closes endpoints, stops the progress thread, releases UCX objects
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "HOST:PORT" the listener is bound to (the actual port if 0 was asked); empty if none.
  std::string listen_address() const;
  // Connects to a node's listener; blocks until the endpoint is usable or the timeout expires.
  Result<PeerId> Connect(const std::string& host_port);
  // Sends a control message (copied). Delivery failures are reported by on_peer_closed.
  Status Send(PeerId peer, std::span<const std::byte> message);
  // Sends a control message and blocks until UCX reports it sent (or failed).
  Status SendAndWait(PeerId peer, std::span<const std::byte> message,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  // Tagged send of `bytes` to `peer`. REQUIRES: bytes stay valid until `done` runs.
  void SendBulk(PeerId peer, uint64_t tag, std::span<const std::byte> bytes, Completion done);
  // Posts a receive for a tagged message from `peer` with exactly `tag` into `buffer`.
  // REQUIRES: buffer stays valid until `done` runs. `done` gets an error if the peer closes.
  void RecvBulk(PeerId peer, uint64_t tag, std::span<std::byte> buffer, Completion done);
  // Closes the endpoint; on_peer_closed is not called for a peer closed this way.
  void Disconnect(PeerId peer);
  // Runs `fn` on the progress thread (used to order work with message handling).
  void Post(std::function<void()> fn);

  struct Stats {
    uint64_t wakeups = 0;         // times the thread woke from epoll
    uint64_t messages_in = 0;
    uint64_t messages_out = 0;
    uint64_t peers = 0;           // currently connected
  };
  Stats stats() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses "HOST:PORT" (IPv4 or name; port 0-65535). Errors name the bad part.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port);

}  // namespace viper::net
