// Node: the catalog of versions (reserve, commit, list) and the relays listed in it; flushes to
// the file tier and pruning are in node_tiers.cc.
#include "viper/node.h"

#include <algorithm>
#include <mutex>

#include "net/engine.h"
#include "node_impl.h"
#include "seal.h"
#include "viper/log.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "node";
}  // namespace

// ---------------------------------------------------------------- catalog

std::optional<proto::VersionInfo> Node::Impl::FindLocked(const std::string& model, uint64_t version) const {
  auto it = models.find(model);
  if (it == models.end() || it->second.versions.empty()) return std::nullopt;
  if (version == 0) return it->second.versions.rbegin()->second;
  auto v = it->second.versions.find(version);
  if (v == it->second.versions.end()) return std::nullopt;
  return v->second;
}

uint64_t Node::Impl::ReserveLocked(const std::string& model) {
  ModelState& state = models[model];
  uint64_t highest = state.reserved;
  if (!state.versions.empty()) highest = std::max(highest, state.versions.rbegin()->first);
  if (auto latest = host->latest(model)) highest = std::max(highest, *latest);
  // Also when recovery is off, and for files the tier skipped (unreadable, corrupt): a new version
  // never reuses the number of a file on disk.
  if (files) highest = std::max(highest, files->HighestVersionNamed(model));
  state.reserved = highest + 1;
  return state.reserved;
}

Result<uint64_t> Node::ReserveVersion(const std::string& model) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ReserveLocked(model);
}

Result<WriteLease> Node::Allocate(uint64_t size) { return impl_->host->Allocate(size); }

Result<proto::VersionInfo> Node::Commit(WriteLease lease, proto::VersionInfo info) {
  return impl_->CommitVersion(std::move(lease), std::move(info));
}

Result<proto::VersionInfo> Node::Impl::CommitVersion(WriteLease lease, proto::VersionInfo info) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(info.model));
  std::string segment = lease.segment_name();
  VIPER_RETURN_IF_ERROR(host->Commit(std::move(lease), info.model, info.version));
  info.completed_ns = WallClockNs();
  internal::SealVersion(options.token, &info);  // this node vouches for it (docs/PROTOCOL.md, "Version seals")
  std::vector<proto::Replica> replicas = {{proto::ReplicaKind::kHostSegment, host_key, segment},
                                          {proto::ReplicaKind::kNode, host_key, address}};
  for (auto& r : info.replicas)  // a relay's upstream replicas follow ours (not this node as a relay)
    if (replicas.size() < proto::kMaxReplicas && r.locator != address &&
        std::find(replicas.begin(), replicas.end(), r) == replicas.end())
      replicas.push_back(std::move(r));
  info.replicas = std::move(replicas);
  // Before the version is listed: a consumer's FETCH must find it among the delta targets, and
  // with cut-through a consumer told early (INCOMING) may FETCH the moment it is listed, before
  // any NOTIFY. The delta from the previous version is encoded now, once, for every remote consumer.
  bool remote_subscribers = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    remote_subscribers = HasRemoteSubscribersLocked(info.model);
  }
  std::function<void()> stop_stale_deltas = deltas ? deltas->OnCommit(info, remote_subscribers) : [] {};
  std::vector<net::PeerId> subscribers;
  proto::VersionInfo notified;  // info, plus a kDevice replica while the GPU copy is live
  {
    std::lock_guard<std::mutex> lock(mu);
    ListRelaysLocked(info);
    ModelState& state = models[info.model];
    state.versions[info.version] = info;
    PruneLocked(info.model);
    subscribers.assign(state.subscribers.begin(), state.subscribers.end());
    stats.versions_committed++;
    stats.notifies_sent += subscribers.size();
    notified = WithDeviceReplicaLocked(info);
  }
  auto notify = proto::Encode(proto::Notify{notified});
  for (net::PeerId peer : subscribers) (void)engine->Send(peer, notify);
  stop_stale_deltas();  // after the NOTIFY: see DeltaStore::OnCommit
  if (info.publish_ns > 0) publish_live.Record(WallClockNs() - info.publish_ns);
  if (registry_agent) registry_agent->Announce(info);
  QueueFlush(info);
  return info;
}

Status Node::WaitFlushed(std::chrono::milliseconds timeout) {
  if (!impl_->flusher->Drain(timeout)) return Status::Timeout("file-tier flushes still running");
  return Status::OK();
}

std::optional<proto::VersionInfo> Node::Latest(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->FindLocked(model, 0);
}

std::vector<proto::VersionInfo> Node::List() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<proto::VersionInfo> out;
  for (const auto& [model, state] : impl_->models)
    for (const auto& [version, info] : state.versions) out.push_back(info);
  return out;
}

bool Node::Impl::HasRemoteSubscribersLocked(const std::string& model) const {
  auto state = models.find(model);
  if (state == models.end()) return false;
  return std::any_of(state->second.subscribers.begin(), state->second.subscribers.end(), [&](net::PeerId id) {
    auto p = peers.find(id);
    return p != peers.end() && (p->second.host_key != host_key || p->second.fetches_bytes);
  });
}

void Node::WhenDeltaPrepared(const std::string& model, uint64_t version, std::function<void(const PreparedDelta&)> fn) {
  if (impl_->deltas) return impl_->deltas->WhenPrepared(model, version, std::move(fn));
  PreparedDelta none;
  none.why_not = "deltas are off on this node";
  fn(none);
}

// Relays of the model (peers that announced a version of it) will hold this version soon after
// its NOTIFY: they are listed as kRelay so that a consumer whose transfer from here breaks can
// fetch from one of them instead of the file tier.
void Node::Impl::ListRelaysLocked(proto::VersionInfo& info) {
  for (const auto& [id, p] : peers) {
    if (p.relayed_models.count(info.model) == 0 || info.replicas.size() >= proto::kMaxReplicas) continue;
    proto::Replica relay{proto::ReplicaKind::kRelay, p.replica.host_key, p.replica.locator};
    if (std::find(info.replicas.begin(), info.replicas.end(), relay) == info.replicas.end()) info.replicas.push_back(relay);
  }
}

}  // namespace viper
