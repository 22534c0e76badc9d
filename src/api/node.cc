#include "viper/node.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "node_impl.h"
#include "viper/engine.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "node";
constexpr int kMaxStrikes = 3;                   // malformed messages before a peer is dropped
constexpr uint64_t kMaxPublishBytes = 1ull << 40;
// Queued flushes keep their version in memory up to this many bytes (and always the first two).
constexpr uint64_t kMaxPinnedFlushBytes = 2ull << 30;

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string NamespaceInode(const char* path) {
  struct stat st{};
  return ::stat(path, &st) == 0 ? std::to_string(st.st_ino) : "?";
}

}  // namespace

Result<DeltaMode> ParseDeltaMode(std::string_view name) {
  if (name == "off") return DeltaMode::kOff;
  if (name == "auto") return DeltaMode::kAuto;
  if (name == "always") return DeltaMode::kAlways;
  return Status::InvalidArgument("delta mode '" + std::string(name) + "' is not one of off|auto|always");
}

std::string_view delta_mode_name(DeltaMode mode) {
  switch (mode) {
    case DeltaMode::kOff: return "off";
    case DeltaMode::kAuto: return "auto";
    case DeltaMode::kAlways: return "always";
  }
  return "?";
}

std::string LocalHostKey() {
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + ":" + NamespaceInode("/proc/self/ns/net") + ":" +
         NamespaceInode("/proc/self/ns/mnt");
}

int64_t WallClockNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// ---------------------------------------------------------------- start / stop

namespace {

// Secure by default: a node reachable from other hosts requires a token unless told otherwise.
Status CheckListenIsGuarded(const NodeOptions& options) {
  const std::string listen = options.listen.empty() ? "127.0.0.1:0" : options.listen;
  if (!options.token.empty() || options.insecure) return Status::OK();
  Result<bool> loopback = net::IsLoopbackAddress(listen);
  if (!loopback.ok()) return loopback.status().WithContext("node: cannot listen on " + listen);
  if (*loopback) return Status::OK();
  return Status::PermissionDenied(
      "node: refusing to listen on " + listen + " without a token: anyone who reaches it could publish, fetch and "
      "announce models. Set a shared token (--token-file FILE or VIPER_TOKEN; NodeOptions::token), listen on "
      "loopback, or accept the risk with --insecure (NodeOptions::insecure)");
}

}  // namespace

Node::Node(const NodeOptions& options) : options_(options), host_key_(LocalHostKey()) {}

Result<std::unique_ptr<Node>> Node::Start(const NodeOptions& options) {
  if (options.keep_host_versions < 1) return Status::InvalidArgument("keep_host_versions must be >= 1");
  if (options.keep_file_versions < 1) return Status::InvalidArgument("keep_file_versions must be >= 1");
  if (options.chunks_in_flight < 1) return Status::InvalidArgument("chunks_in_flight must be >= 1");
  VIPER_RETURN_IF_ERROR(CheckListenIsGuarded(options));
  std::unique_ptr<Node> node(new Node(options));
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  if (impl->options.name.empty()) impl->options.name = "node-" + std::to_string(::getpid());
  impl->host_key = node->host_key_;

  HostTierOptions host_options;
  host_options.prefix = internal::SegmentPrefixFor(options);
  host_options.mode = options.segment_mode;
  host_options.keep_versions = options.keep_host_versions;
  if (!options.store_dir.empty()) {
    FileTierOptions file_options;
    file_options.dir = options.store_dir;
    file_options.keep_versions = options.keep_file_versions;
    file_options.file_mode = options.file_mode;
    VIPER_ASSIGN_OR_RETURN(impl->files, FileTier::Open(file_options));
    // Before the host tier removes a killed predecessor's segments: keep what it had sealed.
    internal::AdoptStaleSegments(host_options.prefix, *impl->files);
  }
  VIPER_ASSIGN_OR_RETURN(impl->host, HostTier::Open(host_options));
  impl->worker = std::make_unique<internal::TaskQueue>("node-worker");
  impl->flusher = std::make_unique<internal::TaskQueue>("node-flusher");
  impl->spare = std::make_unique<internal::TaskQueue>("node-spare");

  net::EngineOptions engine_options;
  engine_options.listen = options.listen.empty() ? "127.0.0.1:0" : options.listen;
  engine_options.token = options.token;  // checked in the bootstrap frame already, then in HELLO
  net::EngineHandlers handlers;
  Impl* raw = impl.get();  // the engine is destroyed before the Impl
  handlers.on_message = [raw](net::PeerId peer, std::span<const std::byte> bytes) { raw->OnMessage(peer, bytes); };
  handlers.on_peer_accepted = [raw](net::PeerId peer, const std::string& addr) { raw->OnPeerAccepted(peer, addr); };
  handlers.on_peer_closed = [raw](net::PeerId peer, const Status& why) { raw->OnPeerClosed(peer, why); };
  auto engine = net::Engine::Start(engine_options, std::move(handlers));
  if (!engine.ok()) return engine.status().WithContext("node: cannot listen on " + engine_options.listen);
  impl->engine = std::move(engine).value();
  impl->address = impl->engine->listen_address();
  if (options.delta_bases > 0 && options.delta != DeltaMode::kOff)
    impl->deltas = std::make_unique<DeltaStore>(impl->options, impl->host.get(), impl->engine.get(), &impl->bytes_sent);
  VIPER_RETURN_IF_ERROR(impl->Recover());
  VIPER_RETURN_IF_ERROR(impl->StartRegistry());
  node->impl_ = std::move(impl);
  log(LogLevel::kInfo, kLog, "{} listening on {}{}", node->impl_->options.name, node->impl_->address,
      options.token.empty() ? "" : " (token required)");
  return node;
}

Node::~Node() {
  if (!impl_) return;
  impl_->registry_agent.reset();  // withdraws this node's records while it still holds them
  // The engine is stopped before it is destroyed: the worker may still be replying through it,
  // and resetting the pointer first would let those replies (and the last handlers) see null.
  impl_->engine->Stop();   // no more handlers, no more bulk completions
  impl_->worker->Close();   // finishes queued verifications (their replies fail: no peer is live)
  impl_->flusher->Close();  // finishes queued flushes: a clean stop persists what was published
  impl_->stopping = true;   // a queued spare segment is not made any more
  impl_->spare->Close();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->peers.clear();  // drops leases before the host tier goes
    impl_->flushing.clear();
  }
  impl_->DropIncoming();
  impl_->deltas.reset();  // stops encoding, drops the bases' leases
  impl_->engine.reset();
}

// The versions on the file tier become the catalog; the latest of each model is loaded back into
// memory so that consumers get it without touching the file system.
Status Node::Impl::Recover() {
  if (!files) return Status::OK();
  std::lock_guard<std::mutex> lock(mu);
  for (const FileEntry& entry : files->List()) {
    proto::VersionInfo info;
    info.model = entry.model;
    info.version = entry.version;
    info.size = entry.size;
    info.checksum = entry.checksum;
    if (auto snap = Snapshot::OpenFile(entry.path); snap.ok()) {
      info.step = snap->step().value_or(0);
      for (const auto& [k, v] : snap->metadata()) info.metadata[k] = v;
    }
    info.replicas.push_back({proto::ReplicaKind::kFile, host_key, entry.path.string()});
    models[entry.model].versions[entry.version] = std::move(info);
  }
  if (!options.recover) return Status::OK();
  for (auto& [model, state] : models) {
    if (state.versions.empty()) continue;
    proto::VersionInfo& info = state.versions.rbegin()->second;
    auto lease = host->Allocate(info.size);
    if (!lease.ok()) return lease.status().WithContext("recovering " + model);
    auto read = files->ReadInto(model, info.version, lease->data());
    if (!read.ok()) {
      log(LogLevel::kWarn, kLog, "recovery of {} version {} from file failed: {}", model, info.version,
          read.status().message());
      continue;
    }
    std::string segment = lease->segment_name();
    VIPER_RETURN_IF_ERROR(host->Commit(std::move(lease).value(), model, info.version));
    info.replicas.insert(info.replicas.begin(), {{proto::ReplicaKind::kHostSegment, host_key, segment},
                                                 {proto::ReplicaKind::kNode, host_key, address}});
    info.completed_ns = WallClockNs();
    log(LogLevel::kInfo, kLog, "recovered {} version {} ({} bytes) from the file tier", model, info.version, info.size);
  }
  return Status::OK();
}

std::string Node::address() const { return impl_->address; }
HostTier& Node::host_tier() { return *impl_->host; }
FileTier* Node::file_tier() { return impl_->files.get(); }

NodeStats Node::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->StatsLocked();
}

NodeStats Node::Impl::StatsLocked() const {
  NodeStats s = stats;
  s.peers = peers.size();
  if (deltas) s.delta = deltas->stats();
  s.flushes_queued = flushing.size();
  s.host = host->stats();
  s.leases_active = 0;
  for (const auto& [id, p] : peers) s.leases_active += p.leases.size();
  s.bytes_sent = bytes_sent.load();
  s.bytes_sent_incoming = bytes_sent_incoming.load();
  return s;
}

// ---------------------------------------------------------------- catalog

std::optional<proto::VersionInfo> Node::Impl::FindLocked(const std::string& model, uint64_t version) const {
  auto it = models.find(model);
  if (it == models.end() || it->second.versions.empty()) return std::nullopt;
  if (version == 0) return it->second.versions.rbegin()->second;
  auto v = it->second.versions.find(version);
  if (v == it->second.versions.end()) return std::nullopt;
  return v->second;
}

// Drops catalog entries that no tier holds any more. Runs at every commit under the node's lock:
// one sorted list per tier, then binary searches (it looked each version up in the file tier, and
// its newest file twice, copying an entry each time: with ~4,000 versions on file an ASan
// producer spent most of each commit here while the UCX thread waited for the lock).
void Node::Impl::PruneLocked(const std::string& model) {
  auto& versions = models[model].versions;
  const std::vector<uint64_t> in_memory = host->versions(model);
  const std::vector<uint64_t> on_file = files ? files->versions(model) : std::vector<uint64_t>{};
  const uint64_t newest_file = on_file.empty() ? 0 : on_file.back();  // newer ones may be flushing
  for (auto it = versions.begin(); it != versions.end();) {
    bool held = std::binary_search(in_memory.begin(), in_memory.end(), it->first) ||
                std::binary_search(on_file.begin(), on_file.end(), it->first);
    bool flushing = files && it->first > newest_file;
    it = (held || flushing) ? std::next(it) : versions.erase(it);
  }
}

uint64_t Node::Impl::ReserveLocked(const std::string& model) {
  ModelState& state = models[model];
  uint64_t highest = state.reserved;
  if (!state.versions.empty()) highest = std::max(highest, state.versions.rbegin()->first);
  if (auto latest = host->latest(model)) highest = std::max(highest, *latest);
  if (files) {  // also when recovery is off: a new version must never reuse a file's number
    if (auto file = files->Latest(model)) highest = std::max(highest, file->version);
  }
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
  std::vector<proto::Replica> replicas = {{proto::ReplicaKind::kHostSegment, host_key, segment},
                                          {proto::ReplicaKind::kNode, host_key, address}};
  for (auto& r : info.replicas)  // a relay's upstream replicas follow ours (not this node as a relay)
    if (replicas.size() < proto::kMaxReplicas && r.locator != address &&
        std::find(replicas.begin(), replicas.end(), r) == replicas.end())
      replicas.push_back(std::move(r));
  info.replicas = std::move(replicas);
  std::vector<net::PeerId> subscribers;
  bool remote_subscribers = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    ListRelaysLocked(info);
    ModelState& state = models[info.model];
    state.versions[info.version] = info;
    PruneLocked(info.model);
    subscribers.assign(state.subscribers.begin(), state.subscribers.end());
    remote_subscribers = HasRemoteSubscribersLocked(info.model);
    stats.versions_committed++;
    stats.notifies_sent += subscribers.size();
  }
  // Before the NOTIFY: a consumer's FETCH must find the version among the delta targets. The
  // delta from the previous version is encoded now, once, for every remote consumer.
  if (deltas) deltas->OnCommit(info, remote_subscribers);
  auto notify = proto::Encode(proto::Notify{info});
  for (net::PeerId peer : subscribers) (void)engine->Send(peer, notify);
  if (registry_agent) registry_agent->Announce(info);
  QueueFlush(info);
  return info;
}

// Writes the version to the file tier in the background, from a read lease on its segment, and
// then lists the file as a replica.
// The lease is taken now, not when the flusher gets to it: a producer publishing faster than the
// file tier writes would otherwise see versions retired from memory before they reach the file
// tier, and an announced version would be in neither after a restart. Until its file is written,
// a FETCH of the version is served from this lease (AcquireLocked). Queued flushes pin their
// segments up to kMaxPinnedFlushBytes of shared memory; beyond that the file tier is far behind,
// and a version retired from memory before its turn is reported as not persisted.
void Node::Impl::QueueFlush(const proto::VersionInfo& info) {
  if (!files) return;
  const auto key = std::make_pair(info.model, info.version);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (flushing.size() < 2 || flushing_bytes + info.size <= kMaxPinnedFlushBytes) {
      if (auto lease = host->Acquire(info.model, info.version); lease.ok()) {
        flushing.emplace(key, std::move(lease).value());
        flushing_bytes += info.size;
      }
    }
  }
  flusher->Post([this, key, size = info.size] {
    const auto& [model, version] = key;
    std::optional<ReadLease> lease;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = flushing.find(key); it != flushing.end()) lease = it->second;
    }
    if (!lease) {
      auto now = host->Acquire(model, version);
      if (!now.ok()) {  // retired by newer versions while the file tier was behind
        log(LogLevel::kError, kLog, "{} version {} not persisted: the file tier fell behind by more than {} ({})",
            model, version, "2 GiB of versions", now.status().message());
        std::lock_guard<std::mutex> lock(mu);
        stats.flush_errors++;
        return;
      }
      lease = std::move(now).value();
    }
    Status st = files->Write(model, version, lease->data());
    std::lock_guard<std::mutex> lock(mu);
    if (flushing.erase(key) != 0) flushing_bytes -= size;
    if (!st.ok()) {
      stats.flush_errors++;
      log(LogLevel::kError, kLog, "flush of {} version {} to the file tier failed: {}", model, version, st.message());
      return;
    }
    stats.files_flushed++;
    auto& versions = models[model].versions;
    if (auto it = versions.find(version); it != versions.end()) {
      it->second.replicas.push_back({proto::ReplicaKind::kFile, host_key, files->PathFor(model, version).string()});
    }
    PruneLocked(model);
    if (registry_agent) registry_agent->CatalogChanged();
  });
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

// ---------------------------------------------------------------- messages

void Node::Impl::Send(net::PeerId peer, const proto::Message& message) {
  Status st = engine->Send(peer, proto::Encode(message));
  if (!st.ok()) log(LogLevel::kDebug, kLog, "send to peer {} failed: {}", peer, st.message());
}

void Node::Impl::SendError(net::PeerId peer, uint64_t request_id, proto::ErrorCode code, const std::string& text) {
  Send(peer, proto::Error{request_id, code, text});
}

void Node::Impl::Refuse(net::PeerId peer, const std::string& why) {
  auto it = peers.find(peer);
  log(LogLevel::kWarn, kLog, "refusing peer {} ({}): {}", peer, it != peers.end() ? it->second.address : "?", why);
  stats.peers_refused++;
  for (auto& [model, state] : models) state.subscribers.erase(peer);
  if (it != peers.end()) ForgetReplicasLocked(it->second);
  peers.erase(peer);
  engine->Disconnect(peer);
}

void Node::Impl::OnPeerAccepted(net::PeerId peer, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu);
  peers[peer].address = address;
  log(LogLevel::kDebug, kLog, "peer {} connected from {}", peer, address);
}

void Node::Impl::OnPeerClosed(net::PeerId peer, const Status& reason) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = peers.find(peer);
  if (it == peers.end()) return;
  log(LogLevel::kInfo, kLog, "peer {} ({}) gone: {}; releasing {} lease(s)", peer, it->second.name,
      reason.message(), it->second.leases.size());
  for (auto& [model, state] : models) state.subscribers.erase(peer);
  ForgetReplicasLocked(it->second);
  peers.erase(it);  // drops its leases: their segments become recyclable
}

void Node::Impl::OnMessage(net::PeerId peer, std::span<const std::byte> bytes) {
  auto decoded = proto::Decode(bytes);
  std::lock_guard<std::mutex> lock(mu);
  auto it = peers.find(peer);
  if (it == peers.end()) it = peers.emplace(peer, PeerState{}).first;  // accepted before we saw it
  PeerState& p = it->second;
  if (!decoded.ok()) {
    stats.malformed_messages++;
    if (decoded.status().code() == StatusCode::kFailedPrecondition) {
      SendError(peer, 0, proto::ErrorCode::kBadVersion, decoded.status().message());
      return Refuse(peer, decoded.status().message());
    }
    SendError(peer, 0, proto::ErrorCode::kMalformed, decoded.status().message());
    if (++p.strikes >= kMaxStrikes) return Refuse(peer, "too many malformed messages, last: " + decoded.status().message());
    log(LogLevel::kWarn, kLog, "peer {}: {}", peer, decoded.status().message());
    return;
  }
  proto::Message& message = *decoded;
  if (!p.hello && !std::holds_alternative<proto::Hello>(message)) {
    SendError(peer, 0, proto::ErrorCode::kUnauthorized, "HELLO must come first");
    return Refuse(peer, std::string(proto::message_type_name(proto::type_of(message))) + " before HELLO");
  }
  Dispatch(peer, p, message);
}

void Node::Impl::Dispatch(net::PeerId peer, PeerState& p, proto::Message& message) {
  if (auto* m = std::get_if<proto::Hello>(&message)) return HandleHello(peer, p, *m);
  if (auto* m = std::get_if<proto::Subscribe>(&message)) return HandleSubscribe(peer, p, *m);
  if (auto* m = std::get_if<proto::Unsubscribe>(&message)) {
    models[m->model].subscribers.erase(peer);
    p.subscriptions.erase(m->model);
    p.incoming_models.erase(m->model);
    return;
  }
  if (auto* m = std::get_if<proto::Fetch>(&message)) return HandleFetch(peer, p, *m);
  if (auto* m = std::get_if<proto::Release>(&message)) return HandleRelease(p, *m);
  if (auto* m = std::get_if<proto::Ack>(&message)) {
    if (options.on_ack) options.on_ack(m->model, m->version);
    return;
  }
  if (auto* m = std::get_if<proto::Publish>(&message)) return HandlePublish(peer, *m);
  if (auto* m = std::get_if<proto::List>(&message)) return HandleList(peer, *m);
  if (auto* m = std::get_if<proto::ReplicaAnnounce>(&message)) return HandleReplica(peer, p, *m);
  if (auto* m = std::get_if<proto::Stats>(&message)) return HandleStats(peer, *m);
  if (std::holds_alternative<proto::Error>(message)) {
    log(LogLevel::kWarn, kLog, "peer {} reported: {}", peer, std::get<proto::Error>(message).text);
    return;
  }
  stats.malformed_messages++;
  SendError(peer, 0, proto::ErrorCode::kBadRequest,
            std::string("unexpected ") + std::string(proto::message_type_name(proto::type_of(message))) + " from a client");
  if (++p.strikes >= kMaxStrikes) Refuse(peer, "too many unexpected messages");
}

void Node::Impl::HandleHello(net::PeerId peer, PeerState& p, const proto::Hello& m) {
  if (!options.token.empty() && !net::TokensEqual(m.token, options.token)) {
    std::string why = m.token.empty() ? "HELLO carries no token" : "HELLO carries a wrong token";
    SendError(peer, 0, proto::ErrorCode::kUnauthorized, why);
    return Refuse(peer, why);
  }
  p.hello = true;
  p.name = m.client_name;
  p.host_key = m.host_key;
  log(LogLevel::kDebug, kLog, "peer {} is {} (pid {})", peer, m.client_name, m.pid);
  Send(peer, proto::HelloOk{options.name, host_key, static_cast<uint32_t>(::getpid())});
}

void Node::Impl::HandleSubscribe(net::PeerId peer, PeerState& p, const proto::Subscribe& m) {
  if (Status st = ValidateModelName(m.model); !st.ok())
    return SendError(peer, 0, proto::ErrorCode::kBadRequest, st.message());
  models[m.model].subscribers.insert(peer);
  p.subscriptions.insert(m.model);
  if ((m.flags & proto::kSubscribeIncoming) != 0) p.incoming_models.insert(m.model);
  if (auto latest = FindLocked(m.model, 0)) Send(peer, proto::Notify{*latest});  // a late joiner gets the model now
  if ((m.flags & proto::kSubscribeIncoming) != 0) SendIncomingLocked(peer, m.model);  // ...and what is arriving
}

Result<ReadLease> Node::Impl::AcquireLocked(const std::string& model, uint64_t version) {
  auto lease = host->Acquire(model, version);
  if (lease.ok()) return lease;
  if (auto it = flushing.find({model, version}); it != flushing.end()) return it->second;
  return lease;
}

void Node::Impl::HandleFetch(net::PeerId peer, PeerState& p, const proto::Fetch& m) {
  auto info = FindLocked(m.model, m.version);
  if (!info && m.version != 0 && incoming.count({m.model, m.version}) != 0) return FetchIncoming(peer, m);
  if (!info) {
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     m.version == 0 ? "model " + m.model + " has no version"
                                    : "model " + m.model + " has no version " + std::to_string(m.version));
  }
  auto lease = AcquireLocked(m.model, info->version);
  if (m.mode == proto::FetchMode::kLease) {
    if (p.host_key != host_key)
      return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest, "a lease needs the same host; use SEND");
    if (!lease.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kNotFound, lease.status().message());
    proto::FetchOk ok{m.request_id, proto::FetchMode::kLease, *info, lease->segment_name(), 0, 0, proto::Encoding::kFull, 0, ""};
    p.leases.emplace(std::make_pair(m.model, info->version), std::move(lease).value());
    stats.leases_granted++;
    return Send(peer, ok);
  }
  p.fetches_bytes = true;
  std::string why_full;  // a FETCH that offered a base says why it gets the full snapshot
  if (m.base_version != 0) {
    if (deltas && deltas->TryStart(peer, m, *info, &why_full)) return;
    if (!deltas) why_full = "deltas are off on this node";
  }
  // SEND: from memory if the version is there, else from its file.
  auto send = std::make_shared<BulkSend>();
  if (lease.ok()) {
    send->hold = lease->hold();
    send->bytes = lease->data();
  } else if (files) {
    auto snap = files->Read(m.model, info->version);
    if (!snap.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kNotFound, snap.status().message());
    send->hold = std::make_shared<Snapshot>(*snap);
    send->bytes = snap->bytes();
  } else {
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound, lease.status().message());
  }
  send->detail = std::move(why_full);
  StartBulkSend(peer, m, *info, std::move(send));
}

void Node::Impl::StartBulkSend(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info,
                               std::shared_ptr<BulkSend> send) {
  send->peer = peer;
  send->request_id = m.request_id;
  send->tag = m.tag;
  send->chunk = ClampChunk(m.chunk_bytes, options.chunk_bytes);
  send->chunks = static_cast<uint32_t>((send->bytes.size() + send->chunk - 1) / send->chunk);
  send->started_ns = WallClockNs();
  proto::FetchOk ok;
  ok.request_id = m.request_id;
  ok.mode = proto::FetchMode::kSend;
  ok.info = info;
  ok.chunk_bytes = send->chunk;
  ok.chunks = send->chunks;
  ok.detail = send->detail;
  Send(peer, ok);
  PumpBulkSend(send);
}

// Keeps up to chunks_in_flight chunks in flight; each completion sends the next. A send that
// forwards a version still arriving waits (parked) for the bytes of its next chunk to land.
void Node::Impl::PumpBulkSend(const std::shared_ptr<BulkSend>& send) {
  while (!send->failed && send->next < send->chunks && send->next - send->done < options.chunks_in_flight) {
    if (send->incoming && !NextChunkReady(send)) return;
    uint32_t index = send->next++;
    uint64_t begin = static_cast<uint64_t>(index) * send->chunk;
    auto piece = send->bytes.subspan(begin, std::min<uint64_t>(send->chunk, send->bytes.size() - begin));
    bool early = send->incoming != nullptr;  // the version was not complete here yet
    engine->SendBulk(send->peer, send->tag + index, piece, [this, send, early, n = piece.size()](const Status& st) {
      send->done++;
      if (!st.ok()) {
        if (!send->failed) log(LogLevel::kInfo, kLog, "transfer to peer {} abandoned: {}", send->peer, st.message());
        send->failed = true;
        return;
      }
      bytes_sent += n;
      if (early) bytes_sent_incoming += n;
      // A whole transfer of bytes that were here times this peer's path for the delta decision.
      if (!early && send->done == send->chunks && !send->failed && deltas)
        deltas->RecordFullSend(send->peer, send->bytes.size(), WallClockNs() - send->started_ns);
      PumpBulkSend(send);
    });
  }
}

void Node::Impl::HandleRelease(PeerState& p, const proto::Release& m) {
  auto it = p.leases.find({m.model, m.version});
  if (it != p.leases.end()) p.leases.erase(it);
}

void Node::Impl::HandleList(net::PeerId peer, const proto::List& m) {
  proto::ListReply reply{m.request_id, {}};
  for (const auto& [model, state] : models)
    for (const auto& [version, info] : state.versions) reply.versions.push_back(info);
  Send(peer, reply);
}

// A relay holds a version too: list it among the version's replicas until the relay disconnects.
void Node::Impl::HandleReplica(net::PeerId peer, PeerState& p, const proto::ReplicaAnnounce& m) {
  const proto::Replica& r = m.replica;
  std::string bad = r.kind != proto::ReplicaKind::kNode ? "only a node replica can be announced"
                    : r.locator.empty() || r.locator.size() > 256 ? "replica locator must be a host:port"
                    : !p.announced.empty() && !(r == p.replica) ? "a peer announces one replica (itself)"
                                                                 : "";
  if (bad.empty() && r.locator == address) bad = "replica locator is this node";
  if (!bad.empty()) {
    stats.malformed_messages++;
    SendError(peer, 0, proto::ErrorCode::kBadRequest, "REPLICA refused: " + bad);
    if (++p.strikes >= kMaxStrikes) Refuse(peer, "too many bad REPLICA messages");
    return;
  }
  auto state = models.find(m.model);
  if (state == models.end()) return;  // nothing of that model here (any more): nothing to list
  auto v = state->second.versions.find(m.version);
  if (v == state->second.versions.end()) return;
  auto& replicas = v->second.replicas;
  std::erase(replicas, proto::Replica{proto::ReplicaKind::kRelay, r.host_key, r.locator});  // it holds it now
  if (std::find(replicas.begin(), replicas.end(), r) != replicas.end() || replicas.size() >= proto::kMaxReplicas) return;
  replicas.push_back(r);
  p.replica = r;
  p.announced.emplace_back(m.model, m.version);
  p.relayed_models.insert(m.model);
  log(LogLevel::kInfo, kLog, "{} version {} is also held by {} ({})", m.model, m.version, r.locator, p.name);
}

void Node::Impl::ForgetReplicasLocked(PeerState& p) {
  const proto::Replica relay{proto::ReplicaKind::kRelay, p.replica.host_key, p.replica.locator};
  for (const auto& model : p.relayed_models) {  // listed as a relay in versions it never fetched
    auto state = models.find(model);
    if (state == models.end()) continue;
    for (auto& [number, info] : state->second.versions) std::erase(info.replicas, relay);
  }
  p.relayed_models.clear();
  for (const auto& [model, version] : p.announced) {
    auto state = models.find(model);
    if (state == models.end()) continue;
    auto v = state->second.versions.find(version);
    if (v == state->second.versions.end()) continue;
    std::erase(v->second.replicas, p.replica);
  }
  p.announced.clear();
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

// A client hands us a snapshot: receive it into a segment, then verify and commit on the worker.
void Node::Impl::HandlePublish(net::PeerId peer, const proto::Publish& m) {
  if (Status st = ValidateModelName(m.model); !st.ok())
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest, st.message());
  if (m.size < 8 || m.size > kMaxPublishBytes)
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest,
                     "snapshot size " + std::to_string(m.size) + " is out of range");
  auto lease = host->Allocate(m.size);
  if (!lease.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kInternal, lease.status().message());
  struct Incoming {
    WriteLease lease;
    uint32_t pending = 0;
    bool failed = false;
  };
  auto in = std::make_shared<Incoming>();
  in->lease = std::move(lease).value();
  uint32_t chunk = ClampChunk(m.chunk_bytes, options.chunk_bytes);
  uint32_t chunks = static_cast<uint32_t>((m.size + chunk - 1) / chunk);
  uint64_t tag = next_tag.fetch_add(1) << 32;
  in->pending = chunks;
  for (uint32_t i = 0; i < chunks; ++i) {
    uint64_t begin = static_cast<uint64_t>(i) * chunk;
    auto piece = in->lease.data().subspan(begin, std::min<uint64_t>(chunk, m.size - begin));
    engine->RecvBulk(peer, tag + i, piece,
                     [this, in, peer, req = m.request_id, model = m.model, step = m.step, t = m.publish_ns](const Status& st) {
                       if (!st.ok()) in->failed = true;
                       if (--in->pending != 0) return;
                       if (in->failed) return;  // the segment goes back to the pool with `in`
                       worker->Post([this, in, peer, req, model, step, t] {
                         FinishClientPublish(peer, req, model, std::move(in->lease), step, t);
                       });
                     });
  }
  Send(peer, proto::PublishReady{m.request_id, tag});
}

void Node::Impl::FinishClientPublish(net::PeerId peer, uint64_t request_id, std::string model, WriteLease lease,
                                     uint64_t step, int64_t publish_ns) {
  ParseOptions parse;
  parse.verify_checksum = true;  // a declared checksum must match
  auto snap = Snapshot::Parse(lease.data(), nullptr, parse);
  if (!snap.ok()) {
    return SendError(peer, request_id, proto::ErrorCode::kBadRequest, "rejected snapshot: " + snap.status().message());
  }
  // The header is re-stamped in place with the version assigned here, so that every replica
  // (segment, file) names its model, version and checksum; that needs Viper's layout, which
  // `viper publish` and the Python client produce from any safetensors file.
  auto layout = SnapshotLayout::Of(*snap);
  if (!layout.ok()) {
    return SendError(peer, request_id, proto::ErrorCode::kBadRequest, "rejected snapshot: " + layout.status().message());
  }
  proto::VersionInfo info;
  info.model = model;
  info.size = lease.data().size();
  info.checksum = snap->compute_checksum();
  info.step = step != 0 ? step : snap->step().value_or(0);
  info.publish_ns = publish_ns;
  {
    std::lock_guard<std::mutex> lock(mu);
    info.version = ReserveLocked(model);
  }
  VersionStamp stamp{model, info.version, info.step, static_cast<uint64_t>(WallClockNs()), info.checksum, snap->loss()};
  if (Status st = layout->WriteHeader(lease.data(), stamp); !st.ok())
    return SendError(peer, request_id, proto::ErrorCode::kBadRequest, "rejected snapshot: " + st.message());
  auto stamped = Snapshot::Parse(lease.data(), nullptr);
  if (!stamped.ok()) return SendError(peer, request_id, proto::ErrorCode::kInternal, stamped.status().message());
  for (const auto& [k, v] : stamped->metadata()) info.metadata[k] = v;
  auto committed = CommitVersion(std::move(lease), std::move(info));
  if (!committed.ok()) return SendError(peer, request_id, proto::ErrorCode::kInternal, committed.status().message());
  Send(peer, proto::PublishOk{request_id, committed->version});
  QueueSpare(committed->size);  // the next PUBLISH lands in a ready segment, as the Publisher's do
}

}  // namespace viper
