// Node: start, stop and recovery. The catalog is in node_catalog.cc, the message server in
// node_server.cc, bulk sends in node_bulk_send.cc, the fan-out and delta parts beside them.
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

#include "net/engine.h"
#include "node_impl.h"
#include "seal.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "node";

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
  // The pid namespace too: a node trusts a same-host peer's pid (a silent peer is kept while that
  // process lives), and a pid from another namespace names another process here.
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + ":" + NamespaceInode("/proc/self/ns/net") + ":" +
         NamespaceInode("/proc/self/ns/mnt") + ":" + NamespaceInode("/proc/self/ns/pid");
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
  if (options.peer_transfer_stall.count() < 0)
    return Status::InvalidArgument("peer_transfer_stall must be >= 0 ms (0: never); got " +
                                   std::to_string(options.peer_transfer_stall.count()) + " ms");
  if (options.peer_liveness_probe.count() < 0 ||
      (options.peer_liveness_probe.count() > 0 && options.peer_liveness_timeout.count() <= 0))
    return Status::InvalidArgument("peer_liveness_probe must be >= 0 ms (0: no pings), and peer_liveness_timeout > 0 ms "
                                   "with it; got " + std::to_string(options.peer_liveness_probe.count()) + " and " +
                                   std::to_string(options.peer_liveness_timeout.count()) + " ms");
  VIPER_RETURN_IF_ERROR(CheckListenIsGuarded(options));
  if (!options.advertise.empty())  // before anything starts: its port is the bound one, known later
    VIPER_RETURN_IF_ERROR(net::Advertise("127.0.0.1:1", options.advertise).status().WithContext("node: advertise"));
  std::unique_ptr<Node> node(new Node(options));
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  if (impl->options.name.empty()) impl->options.name = "node-" + std::to_string(::getpid());
  impl->host_key = node->host_key_;

  HostTierOptions host_options;
  host_options.prefix = internal::SegmentPrefixFor(options);
  host_options.mode = options.segment_mode;
  host_options.keep_versions = options.keep_host_versions;
  host_options.max_bytes = options.host_max_bytes;
  host_options.max_models = options.host_max_models;
  if (!options.store_dir.empty()) {
    FileTierOptions file_options;
    file_options.dir = options.store_dir;
    file_options.keep_versions = options.keep_file_versions;
    file_options.file_mode = options.file_mode;
    VIPER_ASSIGN_OR_RETURN(impl->files, FileTier::Open(file_options));
    // Before the host tier removes a killed predecessor's segments: keep what it had sealed, in
    // the file tier, or else in its segment (and above its number, new versions).
    internal::Adoption adoption = internal::AdoptStaleSegments(host_options.prefix, host_options.mode, *impl->files);
    host_options.keep_stale = std::move(adoption.kept);
    host_options.prefix_is_exclusive = true;  // the store's lock is ours, and the prefix names the store
    for (const auto& [model, version] : adoption.kept_versions) impl->models[model].reserved = version;
  }
  VIPER_ASSIGN_OR_RETURN(impl->host, HostTier::Open(host_options));
  impl->worker = std::make_unique<internal::TaskQueue>("node-worker");
  impl->flusher = std::make_unique<internal::TaskQueue>("node-flusher");
  impl->loader = std::make_unique<internal::TaskQueue>("node-loader");
  impl->spare = std::make_unique<internal::TaskQueue>("node-spare");

  net::EngineOptions engine_options;
  engine_options.listen = options.listen.empty() ? "127.0.0.1:0" : options.listen;
  engine_options.token = options.token;  // proven by challenge-response in the bootstrap handshake
  engine_options.peer_silence = options.peer_liveness_probe;
  engine_options.peer_answer = options.peer_liveness_timeout;
  engine_options.transfer_stall = options.peer_transfer_stall;
  net::EngineHandlers handlers;
  Impl* raw = impl.get();  // the engine is destroyed before the Impl
  handlers.on_message = [raw](net::PeerId peer, std::span<const std::byte> bytes) {
    raw->AwaitStarted();
    raw->OnMessage(peer, bytes);
  };
  handlers.on_peer_accepted = [raw](net::PeerId peer, const std::string& addr) {
    raw->AwaitStarted();
    raw->OnPeerAccepted(peer, addr);
  };
  handlers.on_peer_closed = [raw](net::PeerId peer, const Status& why) {
    raw->AwaitStarted();
    raw->OnPeerClosed(peer, why);
  };
  handlers.on_peer_silent = [raw](net::PeerId peer) {
    raw->AwaitStarted();
    return raw->DropSilentPeer(peer);
  };
  auto engine = net::Engine::Start(engine_options, std::move(handlers));
  if (!engine.ok()) return engine.status().WithContext("node: cannot listen on " + engine_options.listen);
  impl->engine = std::move(engine).value();
  auto advertised = net::Advertise(impl->engine->listen_address(), options.advertise);
  if (!advertised.ok()) return advertised.status().WithContext("node: advertise");
  impl->address = advertised->address;
  if (impl->address != impl->engine->listen_address())
    log(advertised->loopback_only ? LogLevel::kWarn : LogLevel::kInfo, kLog,
        "listening on {}, advertised to peers and the registry as {} ({}){}", impl->engine->listen_address(),
        impl->address, advertised->how,
        advertised->loopback_only ? ": other hosts cannot reach it there; give the node the address they reach "
                                    "(NodeOptions::advertise, `viper serve --advertise HOST`)"
                                  : "");
  if (options.delta_bases > 0 && options.delta != DeltaMode::kOff)
    impl->deltas = std::make_unique<DeltaStore>(impl->options, impl->host.get(), impl->engine.get(), &impl->bytes_sent);
  // What the handlers use is set: they may run (Recover and the registry run beside them, as they
  // take the node's locks).
  impl->started.store(true, std::memory_order_release);
  impl->started.notify_all();
  VIPER_RETURN_IF_ERROR(impl->Recover());
  VIPER_RETURN_IF_ERROR(impl->StartRegistry());
  node->impl_ = std::move(impl);
  log(LogLevel::kInfo, kLog, "{} listening on {}{}", node->impl_->options.name, node->impl_->address,
      options.token.empty() ? "" : " (token required)");
  return node;
}

Node::~Node() {
  if (!impl_) return;
  // Withdraws this node's records while it still holds them; the agent object stays until the
  // node's threads are done, since a commit or flush still running reads the pointer.
  if (impl_->registry_agent) impl_->registry_agent->Stop();
  // The engine is stopped before it is destroyed: the worker may still be replying through it,
  // and resetting the pointer first would let those replies (and the last handlers) see null.
  impl_->engine->Stop();   // no more handlers, no more bulk completions
  impl_->worker->Close();   // finishes queued verifications (their replies fail: no peer is live)
  impl_->loader->Close();   // finishes loads from the file tier (their replies fail: no peer is live)
  impl_->flusher->Close();  // finishes queued flushes: a clean stop persists what was published
  impl_->stopping = true;   // a queued spare segment is not made any more
  impl_->spare->Close();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->peers.clear();  // drops leases before the host tier goes
    impl_->flushing.clear();
    impl_->unflushed.clear();
  }
  impl_->DropIncoming();
  impl_->deltas.reset();  // stops encoding, drops the bases' leases
  impl_->engine.reset();
  impl_->registry_agent.reset();
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
    internal::SealVersion(options.token, &info);  // its own store: this node vouches for it
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
std::string Node::listen_address() const { return impl_->engine->listen_address(); }
HostTier& Node::host_tier() { return *impl_->host; }
FileTier* Node::file_tier() { return impl_->files.get(); }

void Node::SetUpstreamStats(const UpstreamStats& upstream) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stats.upstream = upstream;
}

NodeStats Node::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->StatsLocked();
}

NodeStats Node::Impl::StatsLocked() const {
  NodeStats s = stats;
  s.peers = peers.size();
  s.models = models.size();
  // Connections the listener refused before they became peers count as refused peers too.
  const net::Engine::Stats es = engine ? engine->stats() : net::Engine::Stats{};
  s.peers_refused += es.handshakes_refused;
  s.handshakes_refused_token = es.handshakes_refused_token;
  s.handshakes_timed_out = es.handshakes_timed_out;
  s.handshakes_evicted = es.handshakes_evicted;
  s.handshakes_malformed = es.handshakes_malformed;
  s.peers_silent = es.peers_silent;
  s.peers_stalled = es.peers_stalled;
  if (deltas) s.delta = deltas->stats();
  s.flushes_queued = flushing.size();
  s.unflushed_versions = unflushed.size();
  s.unflushed_bytes = unflushed_bytes;
  s.host = host->stats();
  s.leases_active = 0;
  for (const auto& [id, p] : peers) s.leases_active += p.leases.size();
  s.bytes_sent = bytes_sent.load();
  s.bytes_sent_incoming = bytes_sent_incoming.load();
  s.publish_live = publish_live.Snapshot();
  s.fetch_send = fetch_send.Snapshot();
  return s;
}

}  // namespace viper
