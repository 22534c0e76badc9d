// Node: the control-message server (HELLO, SUBSCRIBE, FETCH, LIST, REPLICA, PUBLISH, ...).
#include "viper/node.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include <fmt/format.h>

#include "core/crypto.h"
#include "net/engine.h"
#include "node_impl.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "node";
constexpr int kMaxStrikes = 3;                   // malformed messages before a peer is dropped
constexpr size_t kMaxSubscriptionsPerPeer = 4096;  // models one peer may subscribe to at once
constexpr uint64_t kMaxPublishBytes = 1ull << 40;
constexpr int kChunkIndexBits = 24;  // a PUBLISH's chunk i has tag (transfer's tag | i)
static_assert(kMaxPublishBytes / (64 << 10) <= (uint64_t{1} << kChunkIndexBits));

// True while process `pid` of this host runs or is stopped; false once it is gone or a zombie
// (killed, not yet reaped by its parent).
bool ProcessLives(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t name_end = text.rfind(')');  // "pid (name) S ...": the name may hold anything
  if (name_end == std::string::npos || name_end + 2 >= text.size()) return true;  // unreadable: kill says it exists
  const char state = text[name_end + 2];
  return state != 'Z' && state != 'X';
}
}  // namespace

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
  ForgetSubscriberLocked(peer);
  if (it != peers.end()) ForgetReplicasLocked(it->second);
  peers.erase(peer);
  engine->Disconnect(peer);
}

// A model's entry that a subscription alone made (no version, none reserved) goes with its last
// subscriber: names that peers subscribe to and leave do not pile up in the table.
void Node::Impl::EraseIfUnusedLocked(std::map<std::string, ModelState>::iterator state) {
  const ModelState& s = state->second;
  if (s.subscribers.empty() && s.versions.empty() && s.reserved == 0) models.erase(state);
}

void Node::Impl::ForgetSubscriberLocked(net::PeerId peer) {
  for (auto it = models.begin(); it != models.end();) {
    auto next = std::next(it);
    if (it->second.subscribers.erase(peer) != 0) EraseIfUnusedLocked(it);
    it = next;
  }
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
  ForgetSubscriberLocked(peer);
  ForgetReplicasLocked(it->second);
  peers.erase(it);  // drops its leases: their segments become recyclable
}

// A peer on this host is dropped for silence only once its process is gone (its death the kernel
// normally reports at once). The network cannot cut it off, and while it lives it is frozen (a
// debugger, a suspended job) or starved: it may still read the segments its leases pin, and
// releasing them would let a new version overwrite bytes it reads. (UCX's own keepalive does not
// end such a connection either: frozen for 70-130 s, a consumer kept its peer and its lease.)
bool Node::Impl::DropSilentPeer(net::PeerId peer) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = peers.find(peer);
  if (it == peers.end() || !it->second.hello || it->second.host_key != host_key) return true;
  PeerState& p = it->second;
  if (!ProcessLives(static_cast<pid_t>(p.pid))) return true;
  if (!p.kept_silent)
    log(LogLevel::kInfo, kLog, "peer {} ({}, pid {} on this host) does not answer pings: kept while it lives, with its "
        "{} lease(s)", peer, p.name, p.pid, p.leases.size());
  p.kept_silent = true;
  return false;
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
    if (auto state = models.find(m->model); state != models.end()) {
      state->second.subscribers.erase(peer);
      EraseIfUnusedLocked(state);
    }
    p.subscriptions.erase(m->model);
    p.incoming_models.erase(m->model);
    p.device_models.erase(m->model);
    return;
  }
  if (auto* m = std::get_if<proto::Fetch>(&message)) return HandleFetch(peer, p, *m);
  if (auto* m = std::get_if<proto::Release>(&message)) return HandleRelease(p, *m);
  if (auto* m = std::get_if<proto::Ack>(&message)) {
    // A peer acknowledges a version this node has announced (perhaps retired since), each once
    // and in order: the publisher's scheduler takes ACK time as a consumer's update latency.
    auto latest = FindLocked(m->model, 0);
    if (!latest || m->version > latest->version) return;
    uint64_t& last = p.acked[m->model];  // only models this node holds: bounded
    if (m->version <= last) return;
    last = m->version;
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
  // No token here: the engine admitted this peer only after it proved the token in the
  // bootstrap handshake (src/net/bootstrap.h); HELLO's token field is unused.
  p.hello = true;
  p.name = m.client_name;
  p.host_key = m.host_key;
  p.pid = m.pid;
  // A peer that says it shares this host (leases, device copies, kept while its process lives)
  // must have connected from one of this host's addresses: the key itself is no secret (HELLO_OK
  // tells every peer).
  if (m.host_key == host_key) {
    Result<bool> here = net::IsAddressOfThisHost(p.address);
    if (!here.ok() || !*here) {
      log(LogLevel::kWarn, kLog, "peer {} ({}) says it shares this host but connected from {}, {}: treated as a peer "
          "on another host", peer, m.client_name, p.address.empty() ? "an unknown address" : p.address,
          here.ok() ? "an address this host does not have" : here.status().message());
      p.host_key = "elsewhere:" + m.host_key;
    }
  }
  log(LogLevel::kDebug, kLog, "peer {} is {} (pid {})", peer, m.client_name, m.pid);
  Send(peer, proto::HelloOk{options.name, host_key, static_cast<uint32_t>(::getpid())});
}

void Node::Impl::HandleSubscribe(net::PeerId peer, PeerState& p, const proto::Subscribe& m) {
  if (Status st = ValidateModelName(m.model); !st.ok())
    return SendError(peer, 0, proto::ErrorCode::kBadRequest, st.message());
  if (p.subscriptions.size() >= kMaxSubscriptionsPerPeer && !p.subscriptions.count(m.model))
    return SendError(peer, 0, proto::ErrorCode::kBadRequest,
                     fmt::format("subscribed to {} models already, the most one connection may", p.subscriptions.size()));
  models[m.model].subscribers.insert(peer);
  p.subscriptions.insert(m.model);
  if ((m.flags & proto::kSubscribeIncoming) != 0) p.incoming_models.insert(m.model);
  if (auto latest = FindLocked(m.model, 0)) Send(peer, proto::Notify{WithDeviceReplicaLocked(*latest)});  // a late joiner gets the model now
  if ((m.flags & proto::kSubscribeIncoming) != 0) SendIncomingLocked(peer, m.model);  // ...and what is arriving
  if ((m.flags & proto::kSubscribeDevice) != 0) {
    p.device_models.insert(m.model);
    if (auto early = DeviceOnlyLocked(m.model, 0); early && WantsDeviceLocked(p, m.model)) Send(peer, proto::Notify{*early});
  }
}

Result<ReadLease> Node::Impl::AcquireLocked(const std::string& model, uint64_t version) {
  auto lease = host->Acquire(model, version);
  if (lease.ok()) return lease;
  if (auto it = flushing.find({model, version}); it != flushing.end()) return it->second;
  if (auto it = unflushed.find({model, version}); it != unflushed.end()) return it->second;
  return lease;
}

void Node::Impl::HandleFetch(net::PeerId peer, PeerState& p, const proto::Fetch& m) {
  if (m.mode == proto::FetchMode::kDevice) return HandleDeviceFetch(peer, p, m);
  // A peer that asks for bytes (SEND), of a complete version or of one still arriving, takes
  // deltas: later versions' deltas are encoded eagerly for it (CommitVersion). Set before the
  // early path too: a consumer whose first version came while still written was not counted, so
  // the next version's delta was made only on its FETCH and PublishResult::delta said "none".
  if (m.mode != proto::FetchMode::kLease) p.fetches_bytes = true;
  auto info = FindLocked(m.model, m.version);
  if (!info && m.version != 0 && incoming.count({m.model, m.version}) != 0) {
    if (ParkForDelta(peer, m)) return;
    return FetchIncoming(peer, m);
  }
  if (!info) {
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     m.version == 0 ? "model " + m.model + " has no version"
                                    : "model " + m.model + " has no version " + std::to_string(m.version));
  }
  auto lease = AcquireLocked(m.model, info->version);
  if (m.mode == proto::FetchMode::kLease) {
    if (p.host_key != host_key)
      return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest, "a lease needs the same host; use SEND");
    if (!lease.ok() && files) return LeaseFromFile(peer, m, *info);  // listed, so on file: load it
    if (!lease.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kNotFound, lease.status().message());
    proto::FetchOk ok{m.request_id, proto::FetchMode::kLease, *info, lease->segment_name(), 0, 0, proto::Encoding::kFull, 0, ""};
    p.leases.emplace(std::make_pair(m.model, info->version), std::move(lease).value());
    stats.leases_granted++;
    return Send(peer, ok);
  }
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

void Node::Impl::HandleRelease(PeerState& p, const proto::Release& m) {
  if (auto d = p.device_leases.find({m.model, m.version}); d != p.device_leases.end()) {
    p.device_leases.erase(d);  // releases the device buffer
    return;
  }
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
  // A relay announces itself: its own host (as its HELLO said, and as checked there) and a
  // HOST:PORT consumers can be sent to; nothing else gets into NOTIFY, LIST or the registry.
  std::string bad = r.kind != proto::ReplicaKind::kNode ? "only a node replica can be announced"
                    : r.locator.empty() || r.locator.size() > 256 || !ParseHostPort(r.locator).ok()
                        ? "replica locator '" + r.locator.substr(0, 64) + "' is not a HOST:PORT"
                    : r.host_key != p.host_key ? "a peer announces a replica on its own host only"
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

// A client hands us a snapshot: receive it into a segment, then verify and commit on the worker.
void Node::Impl::HandlePublish(net::PeerId peer, const proto::Publish& m) {
  if (Status st = ValidateModelName(m.model); !st.ok())
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest, st.message());
  if (m.size < 8 || m.size > kMaxPublishBytes)
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest,
                     "snapshot size " + std::to_string(m.size) + " is out of range");
  auto lease = host->Allocate(m.size);
  if (!lease.ok()) return SendError(peer, m.request_id, OwnFailureCode(lease.status()), lease.status().message());
  struct Incoming {
    WriteLease lease;
    uint32_t pending = 0;
    Status failed;  // the first chunk that did not arrive
  };
  auto in = std::make_shared<Incoming>();
  in->lease = std::move(lease).value();
  uint32_t chunk = proto::ClampChunkBytes(m.chunk_bytes, options.chunk_bytes);
  uint32_t chunks = static_cast<uint32_t>((m.size + chunk - 1) / chunk);
  // The receives are posted on the node's worker, whose address every admitted client learns
  // (anyone, on a node without a token), and UCX matches a tagged message from ANY endpoint: a
  // tag another peer could guess would let it queue its own bytes for this PUBLISH. So the transfer's
  // tag is 40 bits from the CSPRNG above the chunk index (chunks < 2^24: 1 TiB of 64 KiB);
  // two PUBLISHes drawing the same 40 bits while both are outstanding is a 2^-40 event per pair.
  auto random = crypto::RandomBytes(sizeof(uint64_t));
  if (!random.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kInternal, random.status().message());
  uint64_t tag = 0;
  std::memcpy(&tag, random->data(), sizeof tag);
  tag &= ~((uint64_t{1} << kChunkIndexBits) - 1);
  in->pending = chunks;
  for (uint32_t i = 0; i < chunks; ++i) {
    uint64_t begin = static_cast<uint64_t>(i) * chunk;
    auto piece = in->lease.data().subspan(begin, std::min<uint64_t>(chunk, m.size - begin));
    engine->RecvBulk(peer, tag + i, piece,
                     [this, in, peer, req = m.request_id, model = m.model, step = m.step, t = m.publish_ns](const Status& st) {
                       if (!st.ok() && in->failed.ok()) in->failed = st;
                       if (--in->pending != 0) return;
                       if (!in->failed.ok()) {  // the segment goes back to the pool with `in`
                         // The client waits for this answer (a gone client never reads it).
                         return SendError(peer, req, proto::ErrorCode::kBadRequest,
                                          "snapshot not received: " + in->failed.message());
                       }
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
  if (!committed.ok()) return SendError(peer, request_id, OwnFailureCode(committed.status()), committed.status().message());
  Send(peer, proto::PublishOk{request_id, committed->version});
  QueueSpare(committed->size);  // the next PUBLISH lands in a ready segment, as the Publisher's do
}

}  // namespace viper
