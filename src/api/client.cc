#include "api/client.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "client_impl.h"
#include "net/engine.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "client";


uint64_t RequestIdOf(const proto::Message& m) {
  return std::visit(
      [](const auto& x) -> uint64_t {
        if constexpr (requires { x.request_id; }) return x.request_id;
        return 0;
      },
      m);
}
}  // namespace

void EndTransfer(Arrivals& state, const Status& why) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.ended.ok()) state.ended = why;
  state.cv.notify_all();
}

Status StatusFromError(const proto::Error& e) {
  switch (e.code) {
    case proto::ErrorCode::kNotFound: return Status::NotFound(e.text);
    case proto::ErrorCode::kUnauthorized: return Status::PermissionDenied(e.text);
    case proto::ErrorCode::kBadVersion: return Status::FailedPrecondition(e.text);
    case proto::ErrorCode::kMalformed:
    case proto::ErrorCode::kBadRequest: return Status::InvalidArgument(e.text);
    case proto::ErrorCode::kBusy:
    case proto::ErrorCode::kAborted: return Status::Unavailable(e.text);
    case proto::ErrorCode::kExhausted: return Status::ResourceExhausted(e.text);
    case proto::ErrorCode::kInternal: break;
  }
  return Status::Internal(e.text);
}


void Client::Impl::OnMessage(std::span<const std::byte> bytes) {
  last_heard_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  auto decoded = proto::Decode(bytes);
  if (!decoded.ok()) {
    log(LogLevel::kWarn, kLog, "node sent a bad message: {}", decoded.status().message());
    return;
  }
  if (auto* n = std::get_if<proto::Notify>(&*decoded)) {
    if (handlers.on_notify) handlers.on_notify(n->info);
    return;
  }
  if (auto* n = std::get_if<proto::Incoming>(&*decoded)) {
    if (handlers.on_incoming) handlers.on_incoming(n->info);
    return;
  }
  if (auto* part = std::get_if<proto::DeltaPart>(&*decoded)) return OnDeltaPart(*part);
  bool for_delta = false;  // an ERROR that ends a delta stream (client_delta.cc) is not a stray one
  if (auto* e = std::get_if<proto::Error>(&*decoded)) for_delta = OnDeltaError(*e);
  std::lock_guard<std::mutex> lock(mu);
  if (std::holds_alternative<proto::HelloOk>(*decoded) ||
      (std::holds_alternative<proto::Error>(*decoded) && RequestIdOf(*decoded) == 0 && hello_reply)) {
    if (hello_reply) {
      hello_reply->set_value(std::move(*decoded));
      hello_reply.reset();
    } else if (auto* e = std::get_if<proto::Error>(&*decoded)) {
      log(LogLevel::kWarn, kLog, "node: {}", e->text);
    }
    return;
  }
  uint64_t id = RequestIdOf(*decoded);
  auto it = pending.find(id);
  if (auto t = transfers.find(id); t != transfers.end() && it == pending.end()) {
    if (auto* e = std::get_if<proto::Error>(&*decoded)) EndTransfer(*t->second, StatusFromError(*e));
    if (auto* sealed = std::get_if<proto::Sealed>(&*decoded)) {
      std::lock_guard<std::mutex> held(t->second->mu);
      t->second->sealed = std::move(*sealed);
      t->second->cv.notify_all();
    }
    return;
  }
  if (it == pending.end()) {
    if (auto* e = std::get_if<proto::Error>(&*decoded); e != nullptr && !for_delta)
      log(LogLevel::kWarn, kLog, "node: {}", e->text);
    return;
  }
  it->second->set_value(std::move(*decoded));
  pending.erase(it);
}

void Client::Impl::OnClosed(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    close_reason = Status::Unavailable("connection to node " + options.connect + " lost: " + reason.message());
    for (auto& [id, p] : pending) p->set_value(proto::Error{id, proto::ErrorCode::kInternal, close_reason.message()});
    pending.clear();
    if (hello_reply) hello_reply->set_value(proto::Error{0, proto::ErrorCode::kInternal, close_reason.message()});
    hello_reply.reset();
    for (auto& [id, state] : transfers) EndTransfer(*state, close_reason);
    for (auto& [id, inbox] : inboxes) {
      std::lock_guard<std::mutex> held(inbox->mu);
      if (inbox->error.ok()) inbox->error = close_reason;
      inbox->cv.notify_all();
    }
    inboxes.clear();
  }
  if (handlers.on_disconnect) handlers.on_disconnect(close_reason);
}

std::pair<uint64_t, std::future<proto::Message>> Client::Impl::NewRequest() {
  std::lock_guard<std::mutex> lock(mu);
  uint64_t id = next_request++;
  auto p = std::make_shared<std::promise<proto::Message>>();
  pending[id] = p;
  return {id, p->get_future()};
}

Result<proto::Message> Client::Impl::Await(uint64_t id, std::future<proto::Message>& reply,
                                           std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) timeout = options.timeout;
  if (reply.wait_for(timeout) != std::future_status::ready) {
    std::lock_guard<std::mutex> lock(mu);
    pending.erase(id);
    return Status::Timeout("no reply from node " + options.connect + " within " + std::to_string(timeout.count()) +
                           " ms");
  }
  proto::Message m = reply.get();
  if (auto* e = std::get_if<proto::Error>(&m)) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return close_reason;
    return StatusFromError(*e);
  }
  return m;
}

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (!impl_ || !impl_->engine) return;
  if (impl_->engine->OnProgressThread()) {
    // The last owner let go inside one of this connection's own handlers: a handler that holds
    // its owner (a Subscriber's holds the subscriber, and with it its connections) can be left
    // the last reference when the owner closes meanwhile. The engine cannot join its own thread
    // (that aborts): a short-lived thread stops it once the handler has returned, and keeps the
    // state the handlers use alive until then.
    std::thread([engine = std::move(impl_->engine), keep = impl_]() mutable {
      engine.reset();
      keep.reset();
    }).detach();
    return;
  }
  impl_->engine.reset();  // stops the progress thread: no handler runs after this
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options, ClientHandlers handlers) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  if (impl->options.name.empty()) impl->options.name = "client-" + std::to_string(::getpid());
  impl->handlers = std::move(handlers);
  std::random_device rd;
  impl->next_tag = (static_cast<uint64_t>(rd()) & 0xffffff) << 36;  // receiver-chosen, unique per engine

  Impl* raw = impl.get();  // the engine dies before the Impl (~Client)
  net::EngineHandlers eh;
  eh.on_message = [raw](net::PeerId, std::span<const std::byte> bytes) { raw->OnMessage(bytes); };
  eh.on_peer_closed = [raw](net::PeerId, const Status& why) { raw->OnClosed(why); };
  net::EngineOptions eo;  // no listener
  eo.token = options.token;
  VIPER_ASSIGN_OR_RETURN(impl->engine, net::Engine::Start(eo, std::move(eh)));
  // On a failed connect the engine stops before the Impl goes: its thread may still be in
  // OnClosed (the HELLO it answered with an error is what woke us), touching the Impl's members.
  struct StopEngineUnlessConnected {
    Impl& impl;
    bool connected = false;
    ~StopEngineUnlessConnected() {
      if (!connected) impl.engine.reset();
    }
  } guard{*impl};
  auto peer = impl->engine->Connect(options.connect);
  if (!peer.ok()) return peer.status().WithContext("cannot connect to node " + options.connect);
  impl->node = *peer;

  std::future<proto::Message> hello;
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->hello_reply = std::make_shared<std::promise<proto::Message>>();
    hello = impl->hello_reply->get_future();
  }
  // The token was proven in the engine's bootstrap handshake and never crosses the wire.
  VIPER_RETURN_IF_ERROR(impl->SendMessage(
      proto::Hello{"", impl->options.name, impl->host_key, static_cast<uint32_t>(::getpid())}));
  if (hello.wait_for(options.timeout) != std::future_status::ready)
    return Status::Timeout("node " + options.connect + " did not answer HELLO");
  proto::Message reply = hello.get();
  if (auto* e = std::get_if<proto::Error>(&reply)) return StatusFromError(*e).WithContext("node " + options.connect + " refused us");
  std::unique_ptr<Client> client(new Client(impl));
  client->node_ = std::get<proto::HelloOk>(reply);
  guard.connected = true;
  return client;
}

const std::string& Client::address() const { return impl_->options.connect; }

bool Client::same_host() const { return node_.host_key == impl_->host_key; }

bool Client::connected() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->closed;
}

Status Client::Subscribe(const std::string& model, uint8_t flags) {
  return impl_->SendMessage(proto::Subscribe{model, flags});
}

Result<proto::FetchOk> Client::FetchLease(const std::string& model, uint64_t version) {
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::Fetch{id, model, version, proto::FetchMode::kLease, 0, 0}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply));
  if (!std::holds_alternative<proto::FetchOk>(m)) return Status::Internal("unexpected reply to FETCH");
  return std::get<proto::FetchOk>(std::move(m));
}

Result<proto::FetchOk> Client::FetchDevice(const std::string& model, uint64_t version) {
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::Fetch{id, model, version, proto::FetchMode::kDevice, 0, 0}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply));
  if (!std::holds_alternative<proto::FetchOk>(m)) return Status::Internal("unexpected reply to FETCH");
  auto ok = std::get<proto::FetchOk>(std::move(m));
  if (ok.mode != proto::FetchMode::kDevice) {
    Release(model, ok.info.version);
    return Status::Internal("FETCH kDevice answered in another mode");
  }
  return ok;
}

void Client::Release(const std::string& model, uint64_t version) {
  (void)impl_->SendMessage(proto::Release{model, version});
}

std::function<void()> Client::Releaser(const std::string& model, uint64_t version) const {
  std::weak_ptr<Impl> weak = impl_;
  return [weak, model, version] {
    auto impl = weak.lock();
    if (!impl || !impl->engine) return;
    (void)impl->SendMessage(proto::Release{model, version});
  };
}

void Client::Ack(const std::string& model, uint64_t version) { (void)impl_->SendMessage(proto::Ack{model, version}); }


// Sends the FETCH (SEND) under a new request id and waits for FETCH_OK. `before_send` registers
// what must catch messages for the request (its abort, a delta stream's parts) under the id first.
Result<proto::FetchOk> Client::Impl::RequestSend(proto::Fetch fetch, const std::function<void(uint64_t)>& before_send) {
  auto [id, reply] = NewRequest();
  fetch.request_id = id;
  fetch.chunk_bytes = options.chunk_bytes;
  if (before_send) before_send(id);
  VIPER_RETURN_IF_ERROR(SendMessage(fetch));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, Await(id, reply));
  if (!std::holds_alternative<proto::FetchOk>(m)) return Status::Internal("unexpected reply to FETCH");
  return std::get<proto::FetchOk>(std::move(m));
}

std::shared_ptr<Arrivals> Client::Impl::TrackTransfer(uint64_t id) {
  auto state = std::make_shared<Arrivals>();
  std::lock_guard<std::mutex> lock(mu);
  transfers[id] = state;
  return state;
}

void Client::Impl::ForgetTransfer(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  transfers.erase(id);
}

Result<proto::FetchOk> Client::FetchSend(const std::string& model, uint64_t version, const BufferProvider& provide,
                                         const ProgressFn& progress, std::optional<uint64_t>* data_checksum,
                                         TransferPrefix* resume) {
  uint64_t tag = impl_->next_tag.fetch_add(1ull << 24);
  uint64_t id = 0;
  std::shared_ptr<Arrivals> state;
  struct Forget {  // the transfer's entry goes on every return
    Impl* impl;
    const uint64_t& id;
    ~Forget() {
      if (id != 0) impl->ForgetTransfer(id);
    }
  } forget{impl_.get(), id};
  proto::Fetch fetch{0, model, version, proto::FetchMode::kSend, tag, 0, 0, 0};
  const bool resuming = resume != nullptr && resume->landed > 0;
  if (resuming) fetch.offset = resume->landed;
  VIPER_ASSIGN_OR_RETURN(proto::FetchOk ok,
                         impl_->RequestSend(fetch, [&](uint64_t rid) { id = rid, state = impl_->TrackTransfer(rid); }));
  if (ok.encoding == proto::Encoding::kDelta) return Status::Internal("node sent a delta that was not asked for");
  if (resuming && (ok.info.version != resume->info.version || ok.info.size != resume->info.size ||
                   ok.info.checksum != resume->info.checksum)) {
    // Nothing was posted; the node's sends fail when this connection closes.
    return Status::FailedPrecondition("node " + impl_->options.connect + " holds " + model + " version " +
                                      std::to_string(ok.info.version) + " (checksum " + checksum_hex(ok.info.checksum) +
                                      "), not the version " + std::to_string(resume->info.version) + " (checksum " +
                                      checksum_hex(resume->info.checksum) + ") whose prefix landed");
  }
  return impl_->ReceiveChunks(std::move(ok), tag, state, provide, progress, data_checksum, resume);
}

// Posts one receive per chunk into the provided buffer (or, resuming, into the prefix's buffer
// after the prefix), then waits for all of them; the prefix of chunks complete is reported
// (progress) and hashed (data_checksum) as it grows. A transfer that breaks leaves the prefix
// in *resume.
Result<proto::FetchOk> Client::Impl::ReceiveChunks(proto::FetchOk ok, uint64_t tag, const std::shared_ptr<Arrivals>& state,
                                                   const BufferProvider& provide, const ProgressFn& progress,
                                                   std::optional<uint64_t>* data_checksum, TransferPrefix* resume) {
  const std::string& model = ok.info.model;
  const uint64_t size = ok.info.size;
  const uint64_t offset = resume != nullptr ? resume->landed : 0;  // FetchSend asked for [offset, size)
  if (ok.chunk_bytes == 0 || offset >= std::max<uint64_t>(size, 1) ||
      ok.chunks != (size - offset + ok.chunk_bytes - 1) / ok.chunk_bytes || ok.chunks >= (1u << 24))
    return Status::InvalidArgument("node announced an inconsistent transfer (" + std::to_string(ok.chunks) +
                                   " chunks of " + std::to_string(ok.chunk_bytes) + " for " + std::to_string(size) +
                                   " bytes from byte " + std::to_string(offset) + ")");
  std::span<std::byte> buffer;
  if (offset > 0) {
    buffer = resume->buffer;
  } else {
    auto provided = provide(ok.info);
    if (!provided.ok()) return provided.status();  // the node's sends fail when we disconnect or time out
    buffer = *provided;
  }
  if (buffer.size() < size) return Status::Internal("receive buffer smaller than the version");

  state->remaining = ok.chunks;
  state->done.assign(ok.chunks, 0);
  for (uint32_t i = 0; i < ok.chunks; ++i) {
    uint64_t begin = offset + static_cast<uint64_t>(i) * ok.chunk_bytes;
    uint64_t len = std::min<uint64_t>(ok.chunk_bytes, size - begin);
    engine->RecvBulk(node, tag + i, buffer.subspan(begin, len), [state, len, i](const Status& st) {
      std::lock_guard<std::mutex> lock(state->mu);
      if (!st.ok() && state->first_error.ok()) state->first_error = st;
      state->received += st.ok() ? len : 0;
      state->done[i] = st.ok() ? 1 : 0;
      state->remaining--;
      state->cv.notify_all();
    });
  }
  // Reports and hashes the data region [8 + N, size) as its chunks complete in order; N is the
  // header length in the first 8 bytes (a hostile value just means nothing is hashed: the parse
  // rejects it). A resumed transfer continues the prefix's hash.
  std::shared_ptr<internal::PrefixHash> hash = offset > 0 ? resume->hash : nullptr;
  uint64_t prefix_chunks = 0;
  if (data_checksum != nullptr) data_checksum->reset();
  auto landed_bytes = [&] { return std::min(offset + prefix_chunks * ok.chunk_bytes, size); };
  auto advance = [&](std::unique_lock<std::mutex>& held) {
    uint64_t first = prefix_chunks, last = prefix_chunks;
    while (last < ok.chunks && state->done[last]) ++last;
    if (last == first) return;
    held.unlock();
    uint64_t from_byte = offset + first * ok.chunk_bytes, to_byte = std::min(offset + last * ok.chunk_bytes, size);
    if (progress) progress(to_byte, size);
    if (data_checksum != nullptr && from_byte == 0) {
      uint64_t n = 0;
      std::memcpy(&n, buffer.data(), std::min<uint64_t>(8, size));  // little-endian u64, as the format says
      if (size >= 8 && n <= size - 8) {
        hash = std::make_shared<internal::PrefixHash>();
        hash->data_begin = 8 + n;
      }
    }
    if (hash) {
      uint64_t from = std::max(from_byte, hash->data_begin);
      if (to_byte > from) hash->stream.Update(std::span<const std::byte>(buffer.data() + from, to_byte - from));
    }
    held.lock();
    prefix_chunks = last;
  };
  // The prefix that landed, for a transfer elsewhere to finish (only if it grew).
  // A version sealed later has a provisional header in its prefix: it is not resumed elsewhere.
  const bool sealed_later = ok.encoding == proto::Encoding::kFullSealedLater;
  auto leave_prefix = [&] {
    if (resume == nullptr || landed_bytes() <= offset || sealed_later) return;
    resume->info = ok.info;
    resume->buffer = buffer;
    resume->landed = landed_bytes();
    resume->hash = data_checksum != nullptr ? hash : nullptr;
  };
  std::unique_lock<std::mutex> lock(state->mu);
  auto deadline = std::chrono::steady_clock::now() + options.timeout;
  uint64_t last = 0;
  while (state->remaining > 0 && state->ended.ok()) {
    advance(lock);
    if (state->remaining == 0 || !state->ended.ok()) break;
    // The predicate also sees chunks that completed while advance() had the lock released: their
    // notify found nobody waiting, and the node may send nothing more until we report them (a relay
    // forwards what its progress says has landed).
    const uint64_t seen = state->received;
    bool woke = state->cv.wait_until(lock, deadline, [&] {
      return state->remaining == 0 || !state->ended.ok() || state->received != seen ||
             (prefix_chunks < ok.chunks && state->done[prefix_chunks]);
    });
    if (!woke) {
      // Abandon: receives stay posted into `buffer`, so the buffer must not be reused. The caller
      // treats a timed-out transfer's buffer as poisoned; disconnecting cancels the receives.
      leave_prefix();
      return Status::Timeout("transfer of " + model + " version " + std::to_string(ok.info.version) + " stalled at " +
                             std::to_string(offset + state->received) + " of " + std::to_string(size) + " bytes");
    }
    if (state->received != last) {
      deadline = std::chrono::steady_clock::now() + options.timeout;  // progress resets the timer
      last = state->received;
    }
  }
  if (state->remaining > 0) {  // aborted by the node: receives stay posted, as above
    advance(lock);
    leave_prefix();
    return state->ended;
  }
  advance(lock);
  if (!state->first_error.ok()) {
    leave_prefix();
    return state->first_error.WithContext("transfer of " + model + " failed");
  }
  if (sealed_later) {
    // Every chunk is here; the version's checksum and final header come when the node seals it.
    bool sealed = state->cv.wait_until(lock, std::chrono::steady_clock::now() + options.timeout,
                                       [&] { return state->sealed.has_value() || !state->ended.ok(); });
    if (!state->sealed) {
      if (!state->ended.ok()) return state->ended;
      return Status::Timeout("transfer of " + model + " version " + std::to_string(ok.info.version) + ": all " +
                             std::to_string(size) + " bytes arrived but the node did not seal it within " +
                             std::to_string(options.timeout.count()) + " ms");
    }
    (void)sealed;
    proto::Sealed final = std::move(*state->sealed);
    lock.unlock();
    VIPER_RETURN_IF_ERROR(ApplySealed(final, buffer, &ok));
  }
  if (hash && prefix_chunks == ok.chunks) *data_checksum = hash->stream.Digest();
  return ok;
}

// The node's SEALED for a transfer whose every chunk arrived: same version, a header of exactly
// the received header's length (8 + N, N unchanged), which replaces the provisional one.
Status ApplySealed(const proto::Sealed& sealed, std::span<std::byte> buffer, proto::FetchOk* ok) {
  const proto::VersionInfo& sent = ok->info;
  const proto::VersionInfo& final = sealed.info;
  auto named = [](const proto::VersionInfo& v) {
    return v.model + " version " + std::to_string(v.version) + " (" + std::to_string(v.size) + " bytes)";
  };
  if (final.model != sent.model || final.version != sent.version || final.size != sent.size)
    return Status::Corruption("node sealed " + named(final) + ", not " + named(sent) + " that it sent");
  uint64_t n = 0;
  if (sent.size >= 8) std::memcpy(&n, buffer.data(), 8);
  if (sent.size < 8 || n > sent.size - 8 || sealed.header.size() != 8 + n ||
      std::memcmp(sealed.header.data(), buffer.data(), 8) != 0)
    return Status::Corruption("node sealed " + named(final) + " with a header of " + std::to_string(sealed.header.size()) +
                              " bytes, not the " + std::to_string(8 + n) + " it sent");
  std::memcpy(buffer.data(), sealed.header.data(), sealed.header.size());
  ok->info = final;  // the encoding stays kFullSealedLater: the caller checks the final seal
  return Status::OK();
}

std::chrono::milliseconds Client::silent_for() const {
  auto now = std::chrono::steady_clock::now().time_since_epoch();
  auto heard = std::chrono::steady_clock::duration(impl_->last_heard_ns.load(std::memory_order_relaxed));
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - heard);
}

Status Client::Ping(std::chrono::milliseconds timeout) {
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::Stats{id}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply, timeout));
  if (!std::holds_alternative<proto::StatsReply>(m)) return Status::Internal("unexpected reply to STATS");
  return Status::OK();
}

Result<std::map<std::string, uint64_t>> Client::Stats() {
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::Stats{id}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply));
  if (!std::holds_alternative<proto::StatsReply>(m)) return Status::Internal("unexpected reply to STATS");
  return std::get<proto::StatsReply>(std::move(m)).counters;
}

Result<std::vector<proto::VersionInfo>> Client::List() {
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::List{id}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply));
  if (!std::holds_alternative<proto::ListReply>(m)) return Status::Internal("unexpected reply to LIST");
  return std::get<proto::ListReply>(std::move(m)).versions;
}

Status Client::AnnounceReplica(const std::string& model, uint64_t version, const proto::Replica& replica) {
  return impl_->SendMessage(proto::ReplicaAnnounce{model, version, replica});
}

Result<uint64_t> Client::Publish(const std::string& model, std::span<const std::byte> snapshot, uint64_t step,
                                 int64_t publish_ns, const ProgressFn& progress) {
  // The node posts its receives in chunks of what we ask, clamped: ask for exactly what we send.
  const uint32_t chunk = proto::ClampChunkBytes(impl_->options.chunk_bytes, ClientOptions{}.chunk_bytes);
  auto [id, reply] = impl_->NewRequest();
  VIPER_RETURN_IF_ERROR(impl_->SendMessage(proto::Publish{id, model, snapshot.size(), step, publish_ns, chunk}));
  VIPER_ASSIGN_OR_RETURN(proto::Message m, impl_->Await(id, reply));
  if (!std::holds_alternative<proto::PublishReady>(m)) return Status::Internal("unexpected reply to PUBLISH");
  uint64_t tag = std::get<proto::PublishReady>(m).tag;
  // The final reply (PublishOk or Error) reuses the request id. A connection lost since READY
  // came ended every pending request then, not this one: fail now instead of waiting the timeout.
  std::future<proto::Message> final_reply;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closed) return impl_->close_reason;
    auto p = std::make_shared<std::promise<proto::Message>>();
    impl_->pending[id] = p;
    final_reply = p->get_future();
  }
  uint32_t chunks = static_cast<uint32_t>((snapshot.size() + chunk - 1) / chunk);
  auto sent = std::make_shared<std::atomic<uint64_t>>(0);
  const uint64_t total = snapshot.size();
  auto report = progress ? std::make_shared<const ProgressFn>(progress) : nullptr;
  for (uint32_t i = 0; i < chunks; ++i) {
    uint64_t begin = static_cast<uint64_t>(i) * chunk;
    uint64_t length = std::min<uint64_t>(chunk, snapshot.size() - begin);
    // `progress` is held by the completions: one may run after this call returned with an error.
    impl_->engine->SendBulk(impl_->node, tag + i, snapshot.subspan(begin, length),
                            [sent, length, total, report](const Status& st) {
                              uint64_t done = sent->fetch_add(length) + length;
                              if (st.ok() && report) (*report)(done, total);
                            });
  }
  VIPER_ASSIGN_OR_RETURN(proto::Message done, impl_->Await(id, final_reply));
  if (!std::holds_alternative<proto::PublishOk>(done)) return Status::Internal("unexpected reply to PUBLISH");
  return std::get<proto::PublishOk>(done).version;
}

}  // namespace viper
