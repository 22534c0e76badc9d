// Fan-out: a version arriving at a relay node lands straight in one of its segments
// (IncomingVersion) and is forwarded to downstream peers chunk by chunk as it lands; plus the
// node's counters (STATS) and the spare segments it makes between versions.
// Design: docs/ARCHITECTURE.md "Fan-out".
#include <algorithm>

#include "node_impl.h"
#include "seal.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "node";

}  // namespace

std::map<std::string, uint64_t> StatsCounters(const NodeStats& s) {
  std::map<std::string, uint64_t> counters = {{"versions_committed", s.versions_committed}, {"notifies_sent", s.notifies_sent},
          {"leases_granted", s.leases_granted},         {"leases_active", s.leases_active},
          {"peers", s.peers},                           {"peers_refused", s.peers_refused},
          {"models", s.models},
          {"handshakes_refused_token", s.handshakes_refused_token}, {"handshakes_timed_out", s.handshakes_timed_out},
          {"handshakes_evicted", s.handshakes_evicted}, {"handshakes_malformed", s.handshakes_malformed},
          {"peers_silent", s.peers_silent},             {"peers_stalled", s.peers_stalled},
          {"malformed_messages", s.malformed_messages}, {"files_flushed", s.files_flushed},
          {"flush_errors", s.flush_errors},             {"bytes_sent", s.bytes_sent},
          {"bytes_sent_incoming", s.bytes_sent_incoming}, {"incoming_versions", s.incoming_versions},
          {"incoming_aborted", s.incoming_aborted},     {"produced_early", s.produced_early},
          {"delta_encoded", s.delta.encoded},
          {"delta_encoded_bytes", s.delta.encoded_bytes}, {"delta_target_bytes", s.delta.target_bytes},
          {"delta_cancelled", s.delta.cancelled},       {"delta_skipped", s.delta.skipped},       {"delta_sent", s.delta.sent},
          {"delta_sent_bytes", s.delta.sent_bytes},     {"delta_declined", s.delta.declined},
          {"delta_forwarded", s.delta.forwarded},       {"delta_forwarded_bytes", s.delta.forwarded_bytes},
          {"flushes_queued", s.flushes_queued},
          {"unflushed_versions", s.unflushed_versions}, {"unflushed_bytes", s.unflushed_bytes},
          {"versions_delisted", s.versions_delisted},   {"leases_from_file", s.leases_from_file},
          {"host_writing_segments", s.host.writing_segments},
          {"host_committed_segments", s.host.committed_segments},
          {"host_retired_leased_segments", s.host.retired_leased_segments},
          {"host_free_segments", s.host.free_segments},
          {"upstream_subscriptions", s.upstream.subscriptions},
          {"upstream_connected", s.upstream.connected},
          {"upstream_on_preferred", s.upstream.on_preferred},
          {"upstream_connect_failures", s.upstream.connect_failures},
          {"upstream_preferred_returns", s.upstream.preferred_returns},
          {"upstream_liveness_failures", s.upstream.liveness_failures}};
  AddHistogramCounters(counters, "publish_live", s.publish_live);
  AddHistogramCounters(counters, "fetch_send", s.fetch_send);
  return counters;
}

void Node::Impl::HandleStats(net::PeerId peer, const proto::Stats& m) {
  Send(peer, proto::StatsReply{m.request_id, StatsCounters(StatsLocked())});
}

// Makes the next segment of `size` off the caller's path (HostTier::KeepSpare), as the embedded
// Publisher does: the next client PUBLISH or relayed version then lands in faulted-in memory.
void Node::Impl::QueueSpare(uint64_t size) {
  spare->Post([this, size] {
    if (stopping) return;
    if (Status st = host->KeepSpare(size); !st.ok())
      log(LogLevel::kWarn, kLog, "no spare segment of {} bytes: {}", size, st.message());
  });
}

// ---------------------------------------------------------------- receiving

Result<std::unique_ptr<IncomingVersion>> Node::Receive(proto::VersionInfo info, bool by_delta) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(info.model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(info.version));
  if (info.size < 8) return Status::InvalidArgument("a snapshot of " + std::to_string(info.size) + " bytes cannot be received");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto latest = impl_->host->latest(info.model);
    if (latest && *latest >= info.version)
      return Status::FailedPrecondition(info.model + " version " + std::to_string(info.version) +
                                        ": this node already holds version " + std::to_string(*latest));
  }
  VIPER_ASSIGN_OR_RETURN(WriteLease lease, impl_->host->Allocate(info.size));
  auto state = std::make_shared<IncomingVersion::State>();
  state->node = impl_.get();
  state->by_delta = by_delta;
  state->bytes = lease.data();
  state->lease = std::move(lease);
  // Peers learn this node first (it forwards the version as it lands), then the upstream's replicas.
  const proto::Replica self{proto::ReplicaKind::kRelay, host_key_, impl_->address};
  std::erase_if(info.replicas, [&](const proto::Replica& r) { return r.locator == impl_->address; });
  info.replicas.insert(info.replicas.begin(), self);
  if (info.replicas.size() > proto::kMaxReplicas) info.replicas.resize(proto::kMaxReplicas);
  // Forwarded as it lands: the relay checked the upstream's seal; this node seals with its own
  // token (the same fleet key), so that INCOMING carries a seal its consumers can check.
  internal::SealVersion(impl_->options.token, &info);
  state->info = info;
  // An upstream version still being written (its FETCH_OK said sealed later) is forwarded unsealed
  // too: this node's peers get SEALED when the relay seals it (IncomingVersion::Seal).
  state->sealed = info.checksum != 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stats.incoming_versions++;
  }
  impl_->AnnounceIncoming(state);
  return std::unique_ptr<IncomingVersion>(new IncomingVersion(std::move(state)));
}

void Node::Impl::AnnounceIncoming(const std::shared_ptr<IncomingVersion::State>& state) {
  const proto::VersionInfo& info = state->info;  // not changed before the caller has the handle
  std::shared_ptr<IncomingVersion::State> replaced;
  std::vector<net::PeerId> followers;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = incoming[{info.model, info.version}];
    replaced = std::exchange(slot, state);
    for (const auto& [id, p] : peers)
      if (p.incoming_models.count(info.model) != 0) followers.push_back(id);
  }
  if (replaced) AbortIncoming(replaced, "replaced by a new transfer of the same version");
  auto message = proto::Encode(proto::Incoming{info});
  for (net::PeerId peer : followers) (void)engine->Send(peer, message);
}

IncomingVersion::IncomingVersion(std::shared_ptr<State> state) : state_(std::move(state)) {}

IncomingVersion::~IncomingVersion() {
  if (committed_) return;
  state_->node->AbortIncoming(state_, state_->producing ? "its producer abandoned it before sealing it"
                                                        : "the transfer into this node broke off");
}

std::span<std::byte> IncomingVersion::data() const { return state_->bytes; }
const proto::VersionInfo& IncomingVersion::info() const { return state_->info; }

void IncomingVersion::Landed(uint64_t bytes) {
  std::vector<std::shared_ptr<BulkSend>> ready;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (bytes <= state_->landed || state_->aborted) return;
    state_->landed = std::min<uint64_t>(bytes, state_->bytes.size());
    // An unsealed version's header is rewritten at its seal: its sends take this copy instead.
    if (!state_->sealed && !state_->provisional_header) {
      uint64_t header = internal::HeaderLength(state_->bytes.first(state_->landed));
      if (header != 0)
        state_->provisional_header = std::make_shared<const std::vector<std::byte>>(
            state_->bytes.begin(), state_->bytes.begin() + static_cast<std::ptrdiff_t>(header));
    }
    ready.swap(state_->waiting);
  }
  if (ready.empty()) return;
  Node::Impl* node = state_->node;
  node->engine->Post([node, ready = std::move(ready)]() mutable { node->Resume(std::move(ready)); });
}

void IncomingVersion::ForwardDeltaPart(uint64_t base_version, uint64_t base_checksum, uint32_t index,
                                       std::shared_ptr<const std::vector<std::byte>> part, bool last) {
  State& st = *state_;
  Node::Impl* node = st.node;
  if (!node->deltas || !st.by_delta) return;
  std::shared_ptr<DeltaJob> job;
  std::vector<std::pair<net::PeerId, proto::Fetch>> waiters;  // offered this base: served now
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.aborted || st.committed || st.forwarding_refused) return;
    if (!st.forwarded_delta) {
      if (index != 0) return;
      st.forwarded_delta = node->deltas->StartForwarding(st.info, base_version, base_checksum);
      if (!st.forwarded_delta) {
        st.forwarding_refused = true;
        return;
      }
      std::erase_if(st.delta_waiters, [&](auto& w) {
        if (w.second.base_version != base_version || w.second.base_checksum != base_checksum) return false;
        waiters.push_back(std::move(w));
        return true;
      });
    }
    job = st.forwarded_delta;
  }
  if (!node->deltas->AddForwardedPart(job, index, std::move(part), last)) {
    std::lock_guard<std::mutex> lock(st.mu);
    st.forwarding_refused = true;
  }
  for (auto& [peer, fetch] : waiters)
    node->engine->Post([node, peer = peer, fetch = std::move(fetch)] { node->RedoFetch(peer, fetch); });
}

Result<proto::VersionInfo> IncomingVersion::Commit() {
  State& st = *state_;
  WriteLease lease;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.aborted) return Status::FailedPrecondition(st.info.model + " version " + std::to_string(st.info.version) + " was aborted");
    if (!st.sealed)
      return Status::FailedPrecondition(st.info.model + " version " + std::to_string(st.info.version) +
                                        ": committed before it was sealed (IncomingVersion::Seal)");
    if (st.landed < st.bytes.size())
      return Status::FailedPrecondition(st.info.model + " version " + std::to_string(st.info.version) + ": only " +
                                        std::to_string(st.landed) + " of " + std::to_string(st.bytes.size()) +
                                        " bytes have landed");
    lease = std::move(st.lease);
  }
  Node::Impl* node = st.node;
  auto committed = node->CommitVersion(std::move(lease), st.info);  // our kRelay entry gives way to our own replicas
  if (!committed.ok()) {
    node->AbortIncoming(state_, "commit failed: " + committed.status().message());
    return committed.status();
  }
  committed_ = true;
  // Sends still forwarding it read the committed segment now: a read lease keeps it from being
  // recycled until they are done (retention retires only older versions meanwhile).
  auto holding = node->host->Acquire(st.info.model, st.info.version);
  if (!holding.ok()) log(LogLevel::kWarn, kLog, "no hold on just-committed {}: {}", st.info.model, holding.status().message());
  std::vector<std::pair<net::PeerId, proto::Fetch>> waiters;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.committed = true;
    if (holding.ok()) st.holding = *holding;
    waiters.swap(st.delta_waiters);
  }
  {
    std::lock_guard<std::mutex> lock(node->mu);
    auto it = node->incoming.find({st.info.model, st.info.version});
    if (it != node->incoming.end() && it->second == state_) node->incoming.erase(it);
  }
  // The FETCHes that waited for it are answered as any FETCH of a committed version now.
  for (auto& [peer, fetch] : waiters)
    node->engine->Post([node, peer = peer, fetch = std::move(fetch)] { node->RedoFetch(peer, fetch); });
  if (!st.producing) node->QueueSpare(st.bytes.size());  // a producer makes its own spares
  return committed;
}

// Peers receiving it are told (ERROR Aborted) on the progress thread; the segment goes back to the
// pool when the last send reading it is done.
void Node::Impl::AbortIncoming(const std::shared_ptr<IncomingVersion::State>& state, const std::string& why) {
  IncomingVersion::State& st = *state;
  std::vector<std::shared_ptr<BulkSend>> parked, unsealed;
  std::vector<std::pair<net::PeerId, proto::Fetch>> waiters;
  std::shared_ptr<DeltaJob> forwarded;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.aborted || st.committed) return;
    st.aborted = true;
    st.abort_reason = why;
    parked.swap(st.waiting);  // breaks the send <-> state cycle even if the Post below never runs
    unsealed.swap(st.awaiting_seal);  // alive until AbortSends has told their peers
    waiters.swap(st.delta_waiters);
    forwarded = std::move(st.forwarded_delta);
  }
  if (forwarded) deltas->StopForwarding(forwarded, why);
  for (const auto& [peer, fetch] : waiters)
    SendError(peer, fetch.request_id, proto::ErrorCode::kAborted,
              st.info.model + " version " + std::to_string(st.info.version) + " aborted here: " + why);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = incoming.find({st.info.model, st.info.version});
    if (it != incoming.end() && it->second == state) incoming.erase(it);
    stats.incoming_aborted++;
  }
  log(LogLevel::kWarn, kLog, "incoming {} version {} aborted after {} of {} bytes: {}", st.info.model, st.info.version,
      st.landed, st.bytes.size(), why);
  engine->Post([this, state, parked = std::move(parked), unsealed = std::move(unsealed)] { AbortSends(state); });
}

// ---------------------------------------------------------------- forwarding

void Node::Impl::FetchIncoming(net::PeerId peer, const proto::Fetch& m) {
  auto it = incoming.find({m.model, m.version});
  if (it == incoming.end())
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     "model " + m.model + " has no version " + std::to_string(m.version));
  if (m.mode == proto::FetchMode::kLease)
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     m.model + " version " + std::to_string(m.version) + " is still arriving here: SEND it, or lease it once complete");
  std::shared_ptr<IncomingVersion::State> state = it->second;
  auto send = std::make_shared<BulkSend>();
  send->hold = state;
  send->bytes = state->bytes;
  send->incoming = state;
  if (m.base_version != 0)  // ParkForDelta let it through
    send->detail = deltas ? "served as it lands (no delta predicted to pay against it)" : "deltas are off on this node";
  proto::VersionInfo info;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    std::erase_if(state->sends, [](const auto& w) { return w.expired(); });
    state->sends.push_back(send);
    send->sealed_later = !state->sealed;  // Seal, which sends SEALED to it, takes this lock too
    if (send->sealed_later) state->awaiting_seal.push_back(send);
    info = state->info;
  }
  StartBulkSend(peer, m, info, std::move(send));
}

bool Node::Impl::ParkForDelta(net::PeerId peer, const proto::Fetch& m) {
  if (m.base_version == 0 || !deltas) return false;
  auto it = incoming.find({m.model, m.version});
  if (it == incoming.end()) return false;
  // A relay's version decoded from a delta, or the producer's own version while it is written
  // when its updates have been coded small (the last delta's ratio, as for the eager encode):
  // such a peer gets the delta after the commit rather than the full bytes as they land.
  if (!it->second->by_delta && !(it->second->producing && deltas->ExpectsDelta(m.model, it->second->bytes.size())))
    return false;
  auto base = FindLocked(m.model, m.base_version);  // a child without the base gets the full bytes as they land
  if (!base || base->checksum != m.base_checksum) return false;
  IncomingVersion::State& st = *it->second;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.aborted || st.committed) return false;
    // Parked until the commit, or until the upstream's first delta part if it is against this
    // base (ForwardDeltaPart takes the waiters under this lock).
    if (!st.forwarded_delta) {
      st.delta_waiters.emplace_back(peer, m);
      return true;
    }
  }
  if (deltas->TryForward(peer, m, st.info)) return true;  // passed on as it arrives
  std::lock_guard<std::mutex> lock(st.mu);  // another base: the delta after the commit
  if (st.aborted || st.committed) return false;
  st.delta_waiters.emplace_back(peer, m);
  return true;
}

void Node::Impl::RedoFetch(net::PeerId peer, const proto::Fetch& m) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = peers.find(peer);
  if (it == peers.end()) return;  // gone meanwhile
  HandleFetch(peer, it->second, m);
}

bool Node::Impl::NextChunkReady(const std::shared_ptr<BulkSend>& send) {
  if (send->waiting) return false;
  IncomingVersion::State& st = *send->incoming;
  uint64_t end = std::min<uint64_t>(send->bytes.size(), send->offset + (static_cast<uint64_t>(send->next) + 1) * send->chunk);
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.aborted) return false;  // AbortSends (posted) fails it and tells the peer
  if (send->sealed_later && !send->provisional_header) send->provisional_header = st.provisional_header;
  // A send sealed later sends the header from its copy: none goes before that copy exists.
  const bool header_ready = !send->sealed_later || send->provisional_header != nullptr;
  if (st.landed >= end && header_ready) {
    if (st.landed == send->bytes.size()) send->incoming.reset();  // complete: `hold` keeps the state
    return true;
  }
  send->waiting = true;
  st.waiting.push_back(send);
  return false;
}

void Node::Impl::Resume(std::vector<std::shared_ptr<BulkSend>> sends) {
  for (auto& send : sends) {
    send->waiting = false;
    PumpBulkSend(send);
  }
}

void Node::Impl::AbortSends(const std::shared_ptr<IncomingVersion::State>& state) {
  std::vector<std::shared_ptr<BulkSend>> live;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    for (const auto& w : state->sends)
      if (auto s = w.lock()) live.push_back(std::move(s));
    why = state->abort_reason;
  }
  for (auto& send : live) {
    // A send whose chunks are all done still waits for SEALED if FETCH_OK said so.
    if (send->failed || (send->done == send->chunks && !send->sealed_later)) continue;
    send->failed = true;
    SendError(send->peer, send->request_id, proto::ErrorCode::kAborted,
              "transfer of " + state->info.model + " version " + std::to_string(state->info.version) +
                  " aborted: " + why + (state->producing ? "" : "; fetch it from another replica"));
  }
}

void Node::Impl::SendIncomingLocked(net::PeerId peer, const std::string& model) {
  uint64_t latest = host->latest(model).value_or(0);
  for (auto it = incoming.rbegin(); it != incoming.rend(); ++it) {
    if (it->first.first != model || it->first.second <= latest) continue;
    proto::VersionInfo info;
    {
      std::lock_guard<std::mutex> held(it->second->mu);  // Seal may change it
      info = it->second->info;
    }
    return Send(peer, proto::Incoming{std::move(info)});
  }
}

void Node::Impl::DropIncoming() {
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<IncomingVersion::State>> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    all.swap(incoming);
  }
  for (auto& [key, state] : all) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->waiting.clear();
    state->awaiting_seal.clear();
  }
}

}  // namespace viper
