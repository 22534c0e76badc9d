// Engine::Impl: the state behind viper::net::Engine (private to src/net).
//
// Threads: the members under "any thread" are guarded as marked; everything under "progress
// thread only" is touched only by the progress thread, which also creates and destroys every UCX
// object. UCX callbacks run inside ucp_worker_progress (or inside a cancel/close call) on that
// thread. Peers are added and removed only by commands and deferred actions, never from inside a
// UCX callback, so callbacks may hold a Peer* for their duration.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "address.h"
#include "bootstrap.h"
#include "net/engine.h"

namespace viper::net {

using Clock = std::chrono::steady_clock;

namespace detail {

// Active-message ids. kControlAm carries the user's messages; the others are the engine's own.
// kByeAm: "I am closing this connection" (graceful close, after our last send completed): endpoints
// made from worker addresses tell the remote nothing when they close, unlike those of a
// connection manager.
enum AmId : unsigned { kControlAm = 1, kPingAm = 2, kPongAm = 3, kByeAm = 4 };

// user_data of UCX requests. Ops that belong to a peer are listed in Peer::ops so that closing
// the peer can stamp the reason on them (and cancel the receives, which UCX would otherwise keep
// matching forever).
//
// Ownership (the invariant FailOps, Shutdown and the callbacks rely on): an op has exactly one
// owner at a time.
//   1. The code that submits it (DoSendBulk, DoRecvBulk, SendAm, FetchRendezvous) while `submitting`
//      is set, i.e. for the duration of the ucp_*_nbx call. UCX 1.13 may run the completion
//      callback INSIDE that call and still return the (already released) request: a tag receive
//      that matches an unexpected multi-fragment eager message, a rendezvous message larger than
//      the buffer, or a rendezvous from an endpoint already closed. A callback that finds
//      `submitting` set only records `inline_status`/`inline_length` and releases the request; it
//      never deletes the op. The submitter then completes it (Track, FetchRendezvous).
//   2. Otherwise, while its request is pending: the peer's `ops` map (keyed by that live request)
//      and UCX, until the callback runs. Only such ops are ever listed in Peer::ops, so FailOps
//      and the shutdown never see a request that UCX already released.
//   3. The completion (OnSendDone, OnRecvDone, OnAmData), which unlists it and deletes it after
//      calling `done`: nothing refers to it afterwards.
struct Op {
  Engine::Impl* impl = nullptr;
  PeerId peer = 0;
  void* request = nullptr;  // the UCX request while it is pending (owner 2)
  Status reason;            // why the peer closed, if it did before completion
  bool is_recv = false;
  bool submitting = true;   // owner 1: a callback now only records its result
  bool ended_inline = false;
  ucs_status_t inline_status = UCS_OK;
  size_t inline_length = 0;
};
struct SendOp : Op {
  std::shared_ptr<const std::vector<std::byte>> copy;  // control messages are copied
  Completion done;                                     // may be empty
  bool control = false;
  bool bulk = false;  // its completion is a sign of life: the peer took the bytes (EngineOptions::peer_silence)
};
struct RecvOp : Op {
  uint64_t tag = 0;
  size_t expected = 0;
  Completion done;
};

// A control message received but not yet delivered: kept to preserve per-peer order when a
// rendezvous message is still being fetched while later eager ones arrive.
struct Inbound {
  std::unique_ptr<std::byte[]> data;
  size_t size = 0;
  bool ready = false;
};
struct AmDataOp {  // owned as an Op is (submitting, then UCX, then OnAmData); never in Peer::ops
  Engine::Impl* impl = nullptr;
  PeerId peer = 0;
  std::shared_ptr<Inbound> message;
  bool submitting = true;
  bool ended_inline = false;
  ucs_status_t inline_status = UCS_OK;
};
struct RndvPending {  // rendezvous control message to fetch once ucp_worker_progress returns
  PeerId peer;
  void* descriptor;
  std::shared_ptr<Inbound> message;
};

// A peer's life: connecting (client, until the ping is answered) -> open -> closing -> erased.
// Closing gracefully waits for the peer's pending operations to end (sends) and then for a
// flush, bounded by close_deadline; a failed peer is closed at once (forced).
struct Peer {
  enum class Phase { kConnecting, kOpen, kDraining, kFlushing };
  PeerId id = 0;
  ucp_ep_h ep = nullptr;
  std::string address;
  Phase phase = Phase::kConnecting;
  bool say_bye = false;  // graceful close of an open peer: send kByeAm before the flush
  // Set while Connect() waits for the handshake.
  std::shared_ptr<std::promise<Result<PeerId>>> connect;
  Clock::time_point connect_deadline{};
  Clock::time_point close_deadline{};
  // Liveness (EngineOptions::peer_silence): the last sign of life, and when a ping went out that
  // nothing has answered since (epoch: none outstanding).
  Clock::time_point heard = Clock::now();
  Clock::time_point pinged{};
  // Bulk sends to it and receives posted for it pending in UCX, and when one last completed or,
  // none pending before, was posted (EngineOptions::transfer_stall).
  size_t bulk_ops = 0;
  Clock::time_point bulk_progress{};
  std::unordered_map<void*, Op*> ops;  // pending sends and tag receives, by UCX request
  std::deque<std::shared_ptr<Inbound>> inbox;

  bool open() const { return phase == Phase::kOpen; }
  bool closing() const { return phase == Phase::kDraining || phase == Phase::kFlushing; }
};

struct FlushOp {
  Engine::Impl* impl = nullptr;
  PeerId peer = 0;
};

// "<what>: <UCX's text for status>", with a StatusCode chosen from the UCX status.
Status FromUcs(ucs_status_t status, std::string_view what);

}  // namespace detail

struct Engine::Impl {
  Impl(EngineOptions opts, EngineHandlers hs) : options(std::move(opts)), handlers(std::move(hs)) {}

  // ---- fixed after Start
  EngineOptions options;
  EngineHandlers handlers;
  std::string listen_address;
  std::vector<std::byte> worker_address;  // this worker's UCX address, sent in bootstrap frames

  // ---- any thread
  std::mutex queue_mu;
  std::vector<std::function<void()>> queue;  // guarded by queue_mu
  int wake_fd = -1;                          // eventfd; written when `queue` becomes non-empty
  std::atomic<bool> stop_requested{false};
  std::atomic<std::thread::id> progress_thread_id{};
  std::thread thread;
  mutable std::mutex live_mu;
  std::unordered_set<PeerId> live;  // guarded by live_mu: open peers, for Send's fast check
  std::atomic<uint64_t> wakeups{0}, messages_in{0}, messages_out{0}, peer_count{0}, peers_silent{0}, peers_stalled{0};
  // UCX requests whose callback has not run yet (written by the progress thread only).
  std::atomic<uint64_t> outstanding{0};

  void Post(std::function<void()> fn);
  void Wake();
  bool OnProgressThread() const { return std::this_thread::get_id() == progress_thread_id.load(); }
  bool IsLive(PeerId id) const;

  // ---- progress thread only
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::unique_ptr<detail::Acceptor> acceptor;  // the listener (its own thread; bootstrap.h)
  std::shared_ptr<const detail::Acceptor::Counters> acceptor_counters;  // set before Start returns; outlives it
  int epoll_fd = -1;
  int worker_fd = -1;
  PeerId next_peer_id = 1;
  std::unordered_map<PeerId, std::unique_ptr<detail::Peer>> peers;
  std::unordered_map<ucp_ep_h, detail::Peer*> by_ep;
  size_t connecting = 0;  // peers with a pending Connect()
  std::vector<std::function<void()>> deferred;  // run after ucp_worker_progress returns
  std::vector<detail::RndvPending> rndv_pending;
  size_t closing = 0;     // peers in a graceful close
  bool stopping = false;
  Clock::time_point next_liveness_check{};

  // engine.cc: lifecycle and loop
  Status Init();
  void Run();
  bool RunCommands();
  bool Progress();
  void WaitForEvents(Clock::time_point now, int max_timeout_ms);
  int EpollTimeoutMs(Clock::time_point now) const;
  void CheckDeadlines(Clock::time_point now);
  bool LivenessOn() const { return options.peer_silence.count() > 0; }
  bool TransferStallOn() const { return options.transfer_stall.count() > 0; }
  bool PeerChecksOn() const { return LivenessOn() || TransferStallOn(); }
  // Pings open peers silent for peer_silence and fails those silent for peer_answer after it.
  void CheckLiveness(Clock::time_point now);
  void Heard(PeerId id);
  void Shutdown();
  void CompleteAbandonedOps();
  void ReleaseUcx();

  // engine_peers.cc: endpoints
  Status CreateListener(const std::string& host_port);
  Status AcceptAddress(const std::vector<std::byte>& client_address, const std::string& peer_address);
  void StartConnect(const std::string& address, const std::vector<std::byte>& node_address,
                    std::shared_ptr<std::promise<Result<PeerId>>> waiter);
  // An endpoint to the worker whose address is `worker_address`, with peer-failure handling
  // reported to OnEpError; `what` names the attempt in the error.
  Result<ucp_ep_h> CreateEndpoint(const std::vector<std::byte>& worker_address, const std::string& what);
  detail::Peer* AddPeer(ucp_ep_h ep, std::string address);
  detail::Peer* FindPeer(PeerId id);
  detail::Peer* PeerOfEp(ucp_ep_h ep);
  void MarkOpen(detail::Peer& peer);
  void OnEpError(ucp_ep_h ep, ucs_status_t status);
  void ClosePeer(PeerId id, const Status& reason, bool notify, bool graceful);
  void AdvanceClose(detail::Peer& peer);
  void StartFlush(detail::Peer& peer);
  void FinishClose(PeerId id);
  void ForceClose(ucp_ep_h ep);

  // engine_io.cc: messages and bulk data
  Status RegisterAmHandlers();
  ucs_status_t OnControlAm(void* data, size_t length, const ucp_am_recv_param_t* param);
  void OnPing(const ucp_am_recv_param_t* param);
  void OnPong(const ucp_am_recv_param_t* param);
  void OnBye(const ucp_am_recv_param_t* param);
  void FetchRendezvous();
  void OnAmData(detail::AmDataOp* op, ucs_status_t status);
  void DeliverReady(detail::Peer& peer);
  void SendAm(detail::Peer& peer, unsigned id, std::shared_ptr<const std::vector<std::byte>> bytes,
              Completion done);
  void DoSend(PeerId peer, std::shared_ptr<const std::vector<std::byte>> bytes, Completion done);
  void DoSendBulk(PeerId peer, uint64_t tag, std::span<const std::byte> bytes, Completion done);
  void DoRecvBulk(PeerId peer, uint64_t tag, std::span<std::byte> buffer, Completion done);
  void Track(detail::Peer& peer, detail::Op* op, ucs_status_ptr_t request);
  void FailOps(detail::Peer& peer, const Status& reason);
  void Untrack(detail::Op* op);
  void OnSendDone(detail::SendOp* op, ucs_status_t status);
  void OnRecvDone(detail::RecvOp* op, ucs_status_t status, size_t length);
};

}  // namespace viper::net
