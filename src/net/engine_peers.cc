// Endpoints: the listener, Connect's handshake, failure handling and closing.
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "engine_impl.h"
#include "ucx_address.h"
#include "viper/log.h"

namespace viper::net {
namespace {

constexpr const char* kLog = "net";

void OnEpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* impl = static_cast<Engine::Impl*>(arg);
  impl->deferred.push_back([impl, ep, status] { impl->OnEpError(ep, status); });
}

void OnFlushCb(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<detail::FlushOp*>(user_data);
  Engine::Impl* impl = op->impl;
  PeerId id = op->peer;
  delete op;
  impl->outstanding--;
  ucp_request_free(request);
  impl->deferred.push_back([impl, id] { impl->FinishClose(id); });
}

void OnCloseCb(void* request, ucs_status_t status, void* user_data) {
  static_cast<Engine::Impl*>(user_data)->outstanding--;
  ucp_request_free(request);
}

ucp_err_handler_t ErrHandler(Engine::Impl* impl) {
  ucp_err_handler_t handler{};
  handler.cb = OnEpErrorCb;
  handler.arg = impl;
  return handler;
}

}  // namespace

Status Engine::Impl::CreateListener(const std::string& host_port) {
  VIPER_ASSIGN_OR_RETURN(auto parsed, ParseHostPort(host_port));
  Result<detail::SockAddr> addr = detail::Resolve(parsed.first, parsed.second);
  if (!addr.ok()) return addr.status().WithContext(fmt::format("listen on {}", host_port));
  // Runs on the acceptor thread: the endpoint is made here, on the progress thread, and the
  // client gets our address only after it exists (its first message then finds it).
  auto admit = [this](std::vector<std::byte> client_address, const std::string& peer) -> Status {
    auto made = std::make_shared<std::promise<Status>>();
    std::future<Status> result = made->get_future();
    Post([this, client_address = std::move(client_address), peer, made] { made->set_value(AcceptAddress(client_address, peer)); });
    while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (stop_requested.load(std::memory_order_acquire)) return Status::Cancelled("the engine is shutting down");
    }
    return result.get();
  };
  detail::Acceptor::Options acceptor_options;
  acceptor_options.handshake_timeout = options.handshake_timeout;
  acceptor_options.first_frame_timeout = options.handshake_first_frame_timeout;
  acceptor_options.max_pending = options.max_pending_handshakes;
  acceptor_options.max_pending_per_address = options.max_pending_per_address;
  acceptor_options.token = options.token;
  auto started = detail::Acceptor::Start(*addr, worker_address, std::move(admit), acceptor_options);
  if (!started.ok()) return started.status().WithContext(fmt::format("listen on {}", host_port));
  acceptor = std::move(started).value();
  acceptor_counters = acceptor->counters();
  listen_address = acceptor->address();
  log(LogLevel::kInfo, kLog, "listening on {}", listen_address);
  return Status::OK();
}

Status Engine::Impl::AcceptAddress(const std::vector<std::byte>& client_address, const std::string& peer_address) {
  if (stopping) return Status::Unavailable("the engine is shutting down");
  // Both endpoints of a connection to ourselves would live in this worker, and UCX would pair
  // each with itself: messages would arrive on the sending side's peer. Nothing needs it.
  if (client_address == worker_address) return Status::InvalidArgument("this engine connected to its own listener");
  VIPER_ASSIGN_OR_RETURN(ucp_ep_h ep, CreateEndpoint(client_address, fmt::format("accepting a connection from {}", peer_address)));
  detail::Peer* peer = AddPeer(ep, peer_address);
  MarkOpen(*peer);
  log(LogLevel::kInfo, kLog, "accepted peer {} from {}", peer->id, peer_address);
  if (handlers.on_peer_accepted) handlers.on_peer_accepted(peer->id, peer_address);
  return Status::OK();
}

void Engine::Impl::StartConnect(const std::string& address, const std::vector<std::byte>& node_address,
                                std::shared_ptr<std::promise<Result<PeerId>>> waiter) {
  if (stopping) {
    waiter->set_value(Status::Unavailable(fmt::format("connect to {}: the engine is shutting down", address)));
    return;
  }
  Result<ucp_ep_h> ep = CreateEndpoint(node_address, fmt::format("connect to {}: creating the endpoint", address));
  if (!ep.ok()) {
    waiter->set_value(ep.status());
    return;
  }
  detail::Peer* peer = AddPeer(*ep, address);
  peer->connect = std::move(waiter);
  peer->connect_deadline = Clock::now() + options.connect_timeout;
  connecting++;
  // The endpoint is usable once the node's engine answers this ping (UCX queues the send until
  // the wire-up is done; an unreachable node fails the endpoint instead).
  SendAm(*peer, detail::kPingAm, nullptr, nullptr);
}

Result<ucp_ep_h> Engine::Impl::CreateEndpoint(const std::vector<std::byte>& address, const std::string& what) {
  // A peer's address is untrusted: UCX aborts the process on some malformed ones and reads others
  // past their end (src/net/ucx_address.h), so it is checked before UCX unpacks it.
  if (Status valid = detail::CheckUcxWorkerAddress(address, worker_address); !valid.ok()) return valid.WithContext(what);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler = ErrHandler(this);
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(worker, &params, &ep);
  if (st != UCS_OK) return detail::FromUcs(st, what);
  return ep;
}

detail::Peer* Engine::Impl::AddPeer(ucp_ep_h ep, std::string address) {
  auto peer = std::make_unique<detail::Peer>();
  peer->id = next_peer_id++;
  peer->ep = ep;
  peer->address = std::move(address);
  detail::Peer* raw = peer.get();
  by_ep[ep] = raw;
  peers[raw->id] = std::move(peer);
  return raw;
}

detail::Peer* Engine::Impl::FindPeer(PeerId id) {
  auto it = peers.find(id);
  return it == peers.end() ? nullptr : it->second.get();
}

detail::Peer* Engine::Impl::PeerOfEp(ucp_ep_h ep) {
  auto it = by_ep.find(ep);
  return it == by_ep.end() ? nullptr : it->second;
}

// The endpoint's lanes and transports, as UCX prints them (for VIPER_LOG=debug).
static std::string DescribeEp(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "?";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string out(text, size);
  std::free(text);
  return out;
}

void Engine::Impl::MarkOpen(detail::Peer& peer) {
  if (log_enabled(LogLevel::kDebug)) log(LogLevel::kDebug, kLog, "peer {} endpoint:\n{}", peer.id, DescribeEp(peer.ep));
  peer.phase = detail::Peer::Phase::kOpen;
  {
    std::lock_guard<std::mutex> lock(live_mu);
    live.insert(peer.id);
  }
  peer_count.fetch_add(1, std::memory_order_relaxed);
  if (peer.connect) {
    connecting--;
    peer.connect->set_value(peer.id);
    peer.connect.reset();
  }
  DeliverReady(peer);  // messages that arrived before the handshake completed
}

void Engine::Impl::OnEpError(ucp_ep_h ep, ucs_status_t status) {
  detail::Peer* peer = PeerOfEp(ep);
  if (peer == nullptr) return;  // already released
  if (peer->closing()) {        // nothing more to wait for: the endpoint is dead
    FinishClose(peer->id);
    return;
  }
  if (peer->connect) {
    Status reason = detail::FromUcs(status, fmt::format("connect to {} failed (refused or unreachable)", peer->address));
    if (reason.code() != StatusCode::kTimeout) reason = Status::Unavailable(reason.message());
    ClosePeer(peer->id, reason, /*notify=*/false, /*graceful=*/false);
    return;
  }
  Status reason = Status::Unavailable(
      fmt::format("connection to peer {} ({}) failed: {}", peer->id, peer->address, ucs_status_string(status)));
  log(LogLevel::kInfo, kLog, "{}", reason.message());
  ClosePeer(peer->id, reason, /*notify=*/true, /*graceful=*/false);
}

// Stops the peer's use: it leaves the live set, a pending Connect fails, undelivered messages
// are dropped and pending operations get `reason` (receives are cancelled now). Graceful: sends
// already started may finish and are flushed, for at most close_timeout; otherwise forced now.
void Engine::Impl::ClosePeer(PeerId id, const Status& reason, bool notify, bool graceful) {
  detail::Peer* peer = FindPeer(id);
  if (peer == nullptr) return;
  if (peer->closing()) {
    if (!graceful) FinishClose(id);
    return;
  }
  bool was_open = peer->open();
  if (was_open) {
    std::lock_guard<std::mutex> lock(live_mu);
    live.erase(id);
  }
  if (was_open) peer_count.fetch_sub(1, std::memory_order_relaxed);
  if (peer->connect) {
    connecting--;
    peer->connect->set_value(reason);
    peer->connect.reset();
  }
  peer->phase = detail::Peer::Phase::kDraining;
  peer->say_bye = graceful && was_open;
  peer->close_deadline = Clock::now() + options.close_timeout;
  closing++;
  peer->inbox.clear();
  FailOps(*peer, reason);
  if (notify && was_open && handlers.on_peer_closed) handlers.on_peer_closed(id, reason);
  if (graceful) {
    AdvanceClose(*peer);
  } else {
    FinishClose(id);
  }
}

// Called whenever a closing peer's operation ends: once none is left, flush the endpoint.
void Engine::Impl::AdvanceClose(detail::Peer& peer) {
  if (peer.phase != detail::Peer::Phase::kDraining || !peer.ops.empty()) return;
  if (peer.say_bye) {  // after our last send completed, so the remote has everything before it
    peer.say_bye = false;
    SendAm(peer, detail::kByeAm, nullptr, nullptr);
    if (!peer.ops.empty()) return;  // its completion advances the close again
  }
  StartFlush(peer);
}

void Engine::Impl::StartFlush(detail::Peer& peer) {
  peer.phase = detail::Peer::Phase::kFlushing;
  auto* op = new detail::FlushOp{this, peer.id};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = OnFlushCb;
  param.user_data = op;
  ucs_status_ptr_t request = ucp_ep_flush_nbx(peer.ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    delete op;
    FinishClose(peer.id);
    return;
  }
  outstanding++;  // OnFlushCb finishes the close, unless the deadline does it first
}

// Releases the endpoint (forced) and forgets the peer. Operations still pending complete with
// the reason stamped on them by ClosePeer.
void Engine::Impl::FinishClose(PeerId id) {
  detail::Peer* peer = FindPeer(id);
  if (peer == nullptr || !peer->closing()) return;
  std::unique_ptr<detail::Peer> owned = std::move(peers[id]);
  peers.erase(id);
  by_ep.erase(owned->ep);
  closing--;
  ForceClose(owned->ep);
}

// Releases the endpoint without waiting for the peer; UCX completes its remaining requests with
// an error (their callbacks run) and the peer sees the connection drop.
void Engine::Impl::ForceClose(ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  param.cb.send = OnCloseCb;
  param.user_data = this;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr) return;
  if (UCS_PTR_IS_ERR(request)) {
    log(LogLevel::kWarn, kLog, "closing an endpoint failed: {}", ucs_status_string(UCS_PTR_STATUS(request)));
    return;
  }
  outstanding++;
}

}  // namespace viper::net
