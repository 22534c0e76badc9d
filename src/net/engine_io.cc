// Control messages (active messages, eager or rendezvous) and bulk data (tagged send/recv).
#include <cstring>
#include <fmt/format.h>

#include "engine_impl.h"
#include "viper/log.h"

namespace viper::net {
namespace {

constexpr const char* kLog = "net";

ucs_status_t ControlAmCb(void* arg, const void* header, size_t header_length, void* data, size_t length,
                         const ucp_am_recv_param_t* param) {
  return static_cast<Engine::Impl*>(arg)->OnControlAm(data, length, param);
}

ucs_status_t PingAmCb(void* arg, const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param) {
  static_cast<Engine::Impl*>(arg)->OnPing(param);
  return UCS_OK;
}

ucs_status_t ByeAmCb(void* arg, const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
  static_cast<Engine::Impl*>(arg)->OnBye(param);
  return UCS_OK;
}

ucs_status_t PongAmCb(void* arg, const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param) {
  static_cast<Engine::Impl*>(arg)->OnPong(param);
  return UCS_OK;
}

// Bulk data (tagged sends and receives), as EngineOptions::transfer_stall watches it; not control
// messages or pings.
bool IsBulk(const detail::Op* op) { return op->is_recv || static_cast<const detail::SendOp*>(op)->bulk; }

// The completion callbacks release the request and hand the op to its completion, except while
// the op is still being submitted: UCX 1.13 may call them inside the ucp_*_nbx call, and then the
// submitter owns the op and completes it (engine_impl.h, Op).
void SendCb(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<detail::SendOp*>(user_data);
  ucp_request_free(request);
  if (op->submitting) {
    op->ended_inline = true;
    op->inline_status = status;
    return;
  }
  op->impl->outstanding--;
  op->impl->OnSendDone(op, status);
}

void TagRecvCb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<detail::RecvOp*>(user_data);
  size_t length = (status == UCS_OK && info != nullptr) ? info->length : 0;
  ucp_request_free(request);
  if (op->submitting) {
    op->ended_inline = true;
    op->inline_status = status;
    op->inline_length = length;
    return;
  }
  op->impl->outstanding--;
  op->impl->OnRecvDone(op, status, length);
}

void AmDataCb(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* op = static_cast<detail::AmDataOp*>(user_data);
  ucp_request_free(request);
  if (op->submitting) {
    op->ended_inline = true;
    op->inline_status = status;
    return;
  }
  op->impl->outstanding--;
  op->impl->OnAmData(op, status);
}

ucp_request_param_t CallbackParam(void* user_data) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = user_data;
  return param;
}

Status NoPeer(PeerId peer, const char* what, bool stopping) {
  if (stopping) return Status::Cancelled(fmt::format("{} peer {}: the engine is shutting down", what, peer));
  return Status::Unavailable(fmt::format("{} peer {}: not connected (closed or unknown)", what, peer));
}

}  // namespace

Status Engine::Impl::RegisterAmHandlers() {
  struct Entry {
    unsigned id;
    ucp_am_recv_callback_t cb;
  };
  for (Entry e : {Entry{detail::kControlAm, ControlAmCb}, Entry{detail::kPingAm, PingAmCb},
                  Entry{detail::kPongAm, PongAmCb}, Entry{detail::kByeAm, ByeAmCb}}) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = e.id;
    param.flags = UCP_AM_FLAG_WHOLE_MSG;  // reassembled; data not persistent unless RNDV
    param.cb = e.cb;
    param.arg = this;
    ucs_status_t st = ucp_worker_set_am_recv_handler(worker, &param);
    if (st != UCS_OK) return detail::FromUcs(st, fmt::format("registering active-message handler {}", e.id));
  }
  return Status::OK();
}

// ---------------------------------------------------------------- receiving control messages

ucs_status_t Engine::Impl::OnControlAm(void* data, size_t length, const ucp_am_recv_param_t* param) {
  detail::Peer* peer = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? PeerOfEp(param->reply_ep) : nullptr;
  if (peer == nullptr || peer->closing()) {
    log(LogLevel::kDebug, kLog, "dropped a {}-byte control message from an unknown or closing endpoint", length);
    return UCS_OK;
  }
  if (LivenessOn()) peer->heard = Clock::now();
  if (length > options.max_message_bytes) {
    PeerId id = peer->id;
    Status reason = Status::InvalidArgument(fmt::format("peer {} ({}) sent a {}-byte control message; the limit is {}",
                                                        id, peer->address, length, options.max_message_bytes));
    log(LogLevel::kWarn, kLog, "{}: closing it", reason.message());
    deferred.push_back([this, id, reason] { ClosePeer(id, reason, /*notify=*/true, /*graceful=*/false); });
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
  }
  auto message = std::make_shared<detail::Inbound>();
  message->size = length;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // The payload is still at the sender: fetch it once progress returns; keep the slot in order.
    message->data.reset(new std::byte[length]);
    rndv_pending.push_back(detail::RndvPending{peer->id, data, message});
    peer->inbox.push_back(std::move(message));
    return UCS_INPROGRESS;
  }
  if (peer->open() && peer->inbox.empty()) {  // common case: deliver in place, no copy
    messages_in.fetch_add(1, std::memory_order_relaxed);
    if (handlers.on_message) handlers.on_message(peer->id, {static_cast<const std::byte*>(data), length});
    return UCS_OK;
  }
  message->data.reset(new std::byte[length]);
  if (length > 0) std::memcpy(message->data.get(), data, length);
  message->ready = true;
  peer->inbox.push_back(std::move(message));
  DeliverReady(*peer);
  return UCS_OK;
}

void Engine::Impl::FetchRendezvous() {
  std::vector<detail::RndvPending> batch;
  batch.swap(rndv_pending);
  for (detail::RndvPending& item : batch) {
    auto* op = new detail::AmDataOp{this, item.peer, item.message};
    ucp_request_param_t param = CallbackParam(op);
    param.cb.recv_am = AmDataCb;
    ucs_status_ptr_t request =
        ucp_am_recv_data_nbx(worker, item.descriptor, item.message->data.get(), item.message->size, &param);
    op->submitting = false;
    if (op->ended_inline) {  // the callback ran inside the call: `request` is already released
      OnAmData(op, op->inline_status);
    } else if (request == nullptr) {
      OnAmData(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      OnAmData(op, UCS_PTR_STATUS(request));
    } else {
      outstanding++;
    }
  }
}

void Engine::Impl::OnAmData(detail::AmDataOp* op, ucs_status_t status) {
  std::unique_ptr<detail::AmDataOp> owned(op);
  detail::Peer* peer = FindPeer(op->peer);
  if (peer == nullptr) return;  // closed meanwhile: the message is dropped with the peer
  if (status != UCS_OK) {
    // A hole in the ordered stream cannot be repaired: the peer is unusable.
    Status reason = detail::FromUcs(status, fmt::format("receiving a control message from peer {} ({})", peer->id,
                                                        peer->address));
    PeerId id = peer->id;
    deferred.push_back([this, id, reason] {
      ClosePeer(id, Status::Unavailable(reason.message()), /*notify=*/true, /*graceful=*/false);
    });
    return;
  }
  op->message->ready = true;
  DeliverReady(*peer);
}

void Engine::Impl::DeliverReady(detail::Peer& peer) {
  while (peer.open() && !peer.inbox.empty() && peer.inbox.front()->ready) {
    std::shared_ptr<detail::Inbound> message = std::move(peer.inbox.front());
    peer.inbox.pop_front();
    messages_in.fetch_add(1, std::memory_order_relaxed);
    if (handlers.on_message) handlers.on_message(peer.id, {message->data.get(), message->size});
  }
}

void Engine::Impl::OnPing(const ucp_am_recv_param_t* param) {
  detail::Peer* peer = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? PeerOfEp(param->reply_ep) : nullptr;
  if (peer == nullptr || peer->closing()) return;
  if (LivenessOn()) peer->heard = Clock::now();
  SendAm(*peer, detail::kPongAm, nullptr, nullptr);
}

// The remote closes gracefully: everything it sent has arrived (it says bye after its last send
// completed). Closed after progress returns, like every peer removal.
void Engine::Impl::OnBye(const ucp_am_recv_param_t* param) {
  detail::Peer* peer = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? PeerOfEp(param->reply_ep) : nullptr;
  if (peer == nullptr || peer->closing()) return;
  PeerId id = peer->id;
  Status reason = Status::Unavailable(fmt::format("peer {} ({}) closed the connection", id, peer->address));
  deferred.push_back([this, id, reason] { ClosePeer(id, reason, /*notify=*/true, /*graceful=*/false); });
}

void Engine::Impl::OnPong(const ucp_am_recv_param_t* param) {
  detail::Peer* peer = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? PeerOfEp(param->reply_ep) : nullptr;
  if (peer != nullptr && LivenessOn()) peer->heard = Clock::now();
  if (peer != nullptr && peer->connect) {
    log(LogLevel::kInfo, kLog, "connected to {} as peer {}", peer->address, peer->id);
    MarkOpen(*peer);
  }
}

// ---------------------------------------------------------------- sending

void Engine::Impl::SendAm(detail::Peer& peer, unsigned id, std::shared_ptr<const std::vector<std::byte>> bytes,
                          Completion done) {
  auto* op = new detail::SendOp;
  op->impl = this;
  op->peer = peer.id;
  op->copy = std::move(bytes);
  op->done = std::move(done);
  op->control = (id == detail::kControlAm);
  ucp_request_param_t param = CallbackParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver maps the reply endpoint to our PeerId
  param.cb.send = SendCb;
  const void* data = op->copy ? op->copy->data() : nullptr;
  size_t size = op->copy ? op->copy->size() : 0;
  ucs_status_ptr_t request = ucp_am_send_nbx(peer.ep, id, nullptr, 0, data, size, &param);
  Track(peer, op, request);
}

// Ends the submission of `op` (engine_impl.h, Op): registers its pending request with the peer,
// or completes the op if UCX already did, inside the call (its callback recorded the result and
// `request` is already released) or immediately (NULL or an error). Receives are posted with
// UCP_OP_ATTR_FLAG_NO_IMM_CMPL, so they always end through the callback, with the real length.
void Engine::Impl::Track(detail::Peer& peer, detail::Op* op, ucs_status_ptr_t request) {
  op->submitting = false;
  if (!op->ended_inline && request != nullptr && !UCS_PTR_IS_ERR(request)) {
    outstanding++;
    op->request = request;
    peer.ops[request] = op;
    if (IsBulk(op) && peer.bulk_ops++ == 0) peer.bulk_progress = Clock::now();
    return;
  }
  ucs_status_t status = op->ended_inline ? op->inline_status : request == nullptr ? UCS_OK : UCS_PTR_STATUS(request);
  if (op->is_recv) {
    auto* recv = static_cast<detail::RecvOp*>(op);
    // (NULL cannot come back for a receive posted with NO_IMM_CMPL; were it to, it is complete.)
    OnRecvDone(recv, status, op->ended_inline ? op->inline_length : request == nullptr ? recv->expected : 0);
  } else {
    OnSendDone(static_cast<detail::SendOp*>(op), status);
  }
}

void Engine::Impl::DoSend(PeerId id, std::shared_ptr<const std::vector<std::byte>> bytes, Completion done) {
  detail::Peer* peer = FindPeer(id);
  if (peer == nullptr || !peer->open()) {
    if (done) done(NoPeer(id, "send to", stopping));
    return;
  }
  SendAm(*peer, detail::kControlAm, std::move(bytes), std::move(done));
}

void Engine::Impl::DoSendBulk(PeerId id, uint64_t tag, std::span<const std::byte> bytes, Completion done) {
  detail::Peer* peer = FindPeer(id);
  if (peer == nullptr || !peer->open()) {
    if (done) done(NoPeer(id, "bulk send to", stopping));
    return;
  }
  auto* op = new detail::SendOp;
  op->impl = this;
  op->peer = id;
  op->bulk = true;
  op->done = std::move(done);
  ucp_request_param_t param = CallbackParam(op);
  param.cb.send = SendCb;
  Track(*peer, op, ucp_tag_send_nbx(peer->ep, bytes.data(), bytes.size(), tag, &param));
}

void Engine::Impl::DoRecvBulk(PeerId id, uint64_t tag, std::span<std::byte> buffer, Completion done) {
  detail::Peer* peer = FindPeer(id);
  if (peer == nullptr || !peer->open()) {
    if (done) done(NoPeer(id, "bulk receive from", stopping));
    return;
  }
  auto* op = new detail::RecvOp;
  op->impl = this;
  op->peer = id;
  op->is_recv = true;
  op->tag = tag;
  op->expected = buffer.size();
  op->done = std::move(done);
  ucp_request_param_t param = CallbackParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // the callback reports the length (1.13 ignores recv_info)
  param.cb.recv = TagRecvCb;
  Track(*peer, op, ucp_tag_recv_nbx(worker, buffer.data(), buffer.size(), tag, ~ucp_tag_t{0}, &param));
}

// Stamps `reason` on the peer's pending operations and cancels its receives (UCX matches tags
// per worker, so nothing else would ever end them; a receive already matched to a message in
// flight cannot be cancelled and ends with it). Sends end by themselves or when the endpoint is
// closed. Every op listed in peer.ops is alive and its request pending (engine_impl.h, Op); a
// cancel runs the receive's callback at once, which unlists and deletes it: hence the copy.
void Engine::Impl::FailOps(detail::Peer& peer, const Status& reason) {
  std::vector<void*> receives;
  for (auto& [request, op] : peer.ops) {
    op->reason = reason;
    if (op->is_recv) receives.push_back(request);
  }
  for (void* request : receives) ucp_request_cancel(worker, request);
}

// Removes a finished operation from its peer; a closing peer may now be ready to flush.
void Engine::Impl::Untrack(detail::Op* op) {
  if (op->request == nullptr) return;
  detail::Peer* peer = FindPeer(op->peer);
  if (peer == nullptr) return;
  peer->ops.erase(op->request);
  if (IsBulk(op) && peer->bulk_ops > 0) {
    peer->bulk_ops--;
    peer->bulk_progress = Clock::now();
  }
  if (peer->closing() && peer->ops.empty()) {
    PeerId id = op->peer;
    deferred.push_back([this, id] {
      if (detail::Peer* p = FindPeer(id)) AdvanceClose(*p);
    });
  }
}

void Engine::Impl::OnSendDone(detail::SendOp* op, ucs_status_t status) {
  std::unique_ptr<detail::SendOp> owned(op);
  Untrack(op);
  if (status == UCS_OK && op->control) messages_out.fetch_add(1, std::memory_order_relaxed);
  if (status == UCS_OK && op->bulk) Heard(op->peer);
  if (!op->done) return;
  if (status == UCS_OK) {
    op->done(Status::OK());
  } else if (!op->reason.ok()) {
    op->done(op->reason);
  } else {
    op->done(detail::FromUcs(status, fmt::format("{} to peer {}", op->control ? "send" : "bulk send", op->peer)));
  }
}

void Engine::Impl::OnRecvDone(detail::RecvOp* op, ucs_status_t status, size_t length) {
  std::unique_ptr<detail::RecvOp> owned(op);
  Untrack(op);
  if (status == UCS_OK) Heard(op->peer);
  if (!op->done) return;
  std::string what = fmt::format("bulk receive of tag {:#x} from peer {}", op->tag, op->peer);
  if (status == UCS_OK && length == op->expected) {
    op->done(Status::OK());
  } else if (status == UCS_OK) {
    op->done(Status::Corruption(fmt::format("{}: got {} bytes, expected {}", what, length, op->expected)));
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    op->done(Status::InvalidArgument(fmt::format("{}: the message is larger than the {}-byte buffer", what, op->expected)));
  } else if (!op->reason.ok()) {
    op->done(op->reason);
  } else {
    op->done(detail::FromUcs(status, what));
  }
}

}  // namespace viper::net
