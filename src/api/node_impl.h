// Node::Impl: the node's private state and its handlers, shared by the .cc files that implement
// the node (node.cc: start, catalog, messages). Include only from src/api.
//
// Locking: `mu` guards models, peers and stats. Message handlers run on the engine's progress
// thread with `mu` held (OnMessage takes it); file flushes and client-publish verification run on
// the `flusher` and `worker` task queues and take `mu` themselves.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "net/engine.h"
#include "net/protocol.h"
#include "node_delta.h"
#include "registry_agent.h"
#include "store/file_tier.h"
#include "store/host_tier.h"
#include "task_queue.h"
#include "viper/metrics.h"
#include "viper/node.h"

namespace viper {

// Bytes being sent to a peer in chunks, with a window of sends in flight. Lives until the last
// chunk completes; holds what keeps the bytes valid (a lease, a file mapping, or the incoming
// version it forwards). Fields are touched on the progress thread only.
struct BulkSend {
  std::shared_ptr<const void> hold;
  std::span<const std::byte> bytes;  // the whole snapshot
  uint64_t offset = 0;               // a resumed transfer sends bytes [offset, size) (FETCH offset)
  std::shared_ptr<IncomingVersion::State> incoming;  // set while forwarding a version still arriving
  net::PeerId peer = 0;
  uint64_t request_id = 0;
  uint64_t tag = 0;
  uint32_t chunk = 0;
  uint32_t chunks = 0;
  uint32_t next = 0;
  uint32_t done = 0;
  bool failed = false;
  bool waiting = false;  // parked in incoming->waiting until more bytes land
  bool sealed_later = false;  // FETCH_OK kFullSealedLater: SEALED follows when the version is sealed
  // sealed_later: the header as it landed, sent instead of the segment's bytes [0, 8 + N), which the
  // version's writer rewrites when it seals (set by NextChunkReady once the header has landed).
  std::shared_ptr<const std::vector<std::byte>> provisional_header;
  int64_t started_ns = 0;   // its time measures the bandwidth deltas to this peer are weighed against
  std::string detail;       // FETCH_OK's detail (why full when a base was offered)
};

// A version arriving into a segment of this node (src/api/node_fanout.cc). Shared by the writer's
// IncomingVersion handle, the node's `incoming` table and every send that forwards it, so the
// segment stays valid until the last of them is gone.
struct IncomingVersion::State {
  Node::Impl* node = nullptr;
  proto::VersionInfo info;  // as announced in INCOMING
  std::span<std::byte> bytes;
  std::mutex mu;  // guards below
  uint64_t landed = 0;
  bool aborted = false;
  std::string abort_reason;
  bool committed = false;
  WriteLease lease;   // until Commit
  ReadLease holding;  // after Commit: the committed segment, until the last send of it is done
  std::vector<std::shared_ptr<BulkSend>> waiting;  // sends parked until more bytes land
  std::vector<std::weak_ptr<BulkSend>> sends;      // every send of it (told when it aborts)
  // Sends answered FETCH_OK kFullSealedLater, kept until Seal sends them SEALED (a send whose
  // chunks are all done is otherwise gone by then); cleared on abort and at shutdown.
  std::vector<std::shared_ptr<BulkSend>> awaiting_seal;
  bool by_delta = false;  // decoded from a delta as it arrives (Node::Receive)
  bool producing = false;  // written by this process (Node::Produce): the producer's cut-through
  bool sealed = true;      // info.checksum is known (false from Produce, or a relayed unsealed version, until Seal)
  // Unsealed: a copy of the header [0, 8 + N) as it landed (taken by the writer's thread in Produce
  // or Landed, before it can rewrite it), which sealed_later sends send instead of the segment's.
  std::shared_ptr<const std::vector<std::byte>> provisional_header;
  // FETCHes that offered a base this node holds, answered once it is committed (by_delta only),
  // or as soon as the upstream's delta is passed on (forwarded) if they offered its base.
  std::vector<std::pair<net::PeerId, proto::Fetch>> delta_waiters;
  // The upstream's delta passed on as it arrives (ForwardDeltaPart); null until its first part,
  // and when deltas or forwarding are off.
  std::shared_ptr<DeltaJob> forwarded_delta;
  bool forwarding_refused = false;  // StartForwarding declined: later parts are not offered again
};

struct Node::Impl {
  NodeOptions options;
  std::string host_key;
  std::string address;
  std::unique_ptr<HostTier> host;
  std::unique_ptr<FileTier> files;
  std::unique_ptr<DeltaStore> deltas;            // null when delta_bases == 0
  std::unique_ptr<internal::TaskQueue> worker;   // verifies client publishes
  std::unique_ptr<internal::TaskQueue> flusher;  // writes versions to the file tier
  std::unique_ptr<internal::TaskQueue> spare;    // makes the host tier's next segment (KeepSpare)
  std::unique_ptr<internal::TaskQueue> loader;   // loads file-only versions into segments (LeaseFromFile)
  std::atomic<bool> stopping{false};             // a queued spare is not made any more
  // Set once Node::Start has stored what the engine's handlers use (the engine itself, the address,
  // the delta store). The handlers wait for it: a peer may connect the moment the engine listens (a
  // node restarted on a fixed port), before Start has stored the engine they reply through.
  std::atomic<bool> started{false};
  void AwaitStarted() const {
    while (!started.load(std::memory_order_acquire)) started.wait(false, std::memory_order_acquire);
  }
  std::unique_ptr<net::Engine> engine;           // declared last: destroyed first
  // With NodeOptions::registry (node_registry.cc). Stopped first in ~Node.
  std::unique_ptr<internal::RegistryAgent> registry_agent;

  struct ModelState {
    std::map<uint64_t, proto::VersionInfo> versions;
    std::set<net::PeerId> subscribers;
    uint64_t reserved = 0;
  };
  struct PeerState {
    std::string address;
    bool hello = false;
    std::string host_key;
    std::string name;
    uint32_t pid = 0;  // as its HELLO says (checked only for a peer on this host: DropSilentPeer)
    int strikes = 0;
    bool fetches_bytes = false;  // asked for SEND transfers: a consumer that takes deltas
    std::multimap<std::pair<std::string, uint64_t>, ReadLease> leases;
    // Leases on GPU-resident copies (node_device.cc): each releases itself when dropped.
    std::multimap<std::pair<std::string, uint64_t>, std::shared_ptr<void>> device_leases;
    std::set<std::string> subscriptions;
    std::map<std::string, uint64_t> acked;  // the last version of each model it acknowledged
    std::set<std::string> incoming_models;  // subscriptions that also get INCOMING
    std::set<std::string> device_models;    // ...that also get device-only NOTIFYs (same host only)
    std::vector<std::pair<std::string, uint64_t>> announced;  // versions this relay said it holds
    std::set<std::string> relayed_models;                      // ...and their models
    proto::Replica replica;                                    // ...as this replica
    bool kept_silent = false;  // said once that it is silent and kept (DropSilentPeer)
  };

  mutable std::mutex mu;
  std::map<std::string, ModelState> models;
  // GPU-resident copies by model (node_device.cc); guarded by mu.
  std::map<std::string, std::shared_ptr<DeviceReplicaSource>> device_sources;
  // The last device-only announcement per model (AnnounceDevice), as NOTIFY carried it; guarded by mu.
  std::map<std::string, proto::VersionInfo> device_announced;
  std::map<net::PeerId, PeerState> peers;
  NodeStats stats;
  // Versions arriving here (IncomingVersion), by (model, version); guarded by mu.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<IncomingVersion::State>> incoming;
  // Counted on the progress thread as sends complete (no lock there).
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_sent_incoming{0};
  // Latency histograms (lock-free; docs/ARCHITECTURE.md "Observability").
  LatencyRecorder publish_live;  // info.publish_ns -> NOTIFY sent (CommitVersion)
  LatencyRecorder fetch_send;    // FETCH answered with SEND -> its last chunk sent
  // Versions queued for the file tier, each with a lease that keeps it in memory until its file
  // is written (QueueFlush), and their bytes.
  std::map<std::pair<std::string, uint64_t>, ReadLease> flushing;
  uint64_t flushing_bytes = 0;
  // Versions whose flush failed (e.g. a full disk), each with the lease that keeps its only copy
  // in memory until a retry writes it, and their bytes (node_tiers.cc). Together with `flushing`
  // within NodeOptions::unflushed_budget_bytes; versions queued for a retry.
  std::map<std::pair<std::string, uint64_t>, ReadLease> unflushed;
  uint64_t unflushed_bytes = 0;
  std::set<std::pair<std::string, uint64_t>> retrying;

  // --- message handling (progress thread) ---
  void OnMessage(net::PeerId peer, std::span<const std::byte> bytes);
  void OnPeerAccepted(net::PeerId peer, const std::string& address);
  void OnPeerClosed(net::PeerId peer, const Status& reason);
  // The engine found `peer` silent (NodeOptions::peer_liveness_probe): true to drop it. A peer on
  // this node's host is kept while its process lives (see the definition).
  bool DropSilentPeer(net::PeerId peer);
  void Dispatch(net::PeerId peer, PeerState& p, proto::Message& message);
  void HandleHello(net::PeerId peer, PeerState& p, const proto::Hello& m);
  void HandleSubscribe(net::PeerId peer, PeerState& p, const proto::Subscribe& m);
  void HandleFetch(net::PeerId peer, PeerState& p, const proto::Fetch& m);
  void HandleRelease(PeerState& p, const proto::Release& m);
  // --- GPU-resident copies (node_device.cc; REQUIRES: mu held) ---
  void HandleDeviceFetch(net::PeerId peer, PeerState& p, const proto::Fetch& m);
  // `info` as a NOTIFY carries it: with a kDevice replica when the model's device copy is live at
  // info.version.
  proto::VersionInfo WithDeviceReplicaLocked(const proto::VersionInfo& info) const;
  // The device-only announcement of `model` newer than its catalog and still live on the device
  // (at `version`, or any with 0), if there is one.
  std::optional<proto::VersionInfo> DeviceOnlyLocked(const std::string& model, uint64_t version) const;
  // A same-host subscriber that asked for device-only NOTIFYs of `model`.
  bool WantsDeviceLocked(const PeerState& p, const std::string& model) const {
    return p.host_key == host_key && p.device_models.count(model) != 0;
  }
  void HandlePublish(net::PeerId peer, const proto::Publish& m);
  void EraseIfUnusedLocked(std::map<std::string, ModelState>::iterator state);
  void ForgetSubscriberLocked(net::PeerId peer);  // from every model, erasing entries left unused
  void HandleList(net::PeerId peer, const proto::List& m);
  void HandleReplica(net::PeerId peer, PeerState& p, const proto::ReplicaAnnounce& m);
  void ForgetReplicasLocked(PeerState& p);
  void ListRelaysLocked(proto::VersionInfo& info);
  // Subscribers of `model` that fetch over the network (another host, or SEND from this one).
  bool HasRemoteSubscribersLocked(const std::string& model) const;

  void Send(net::PeerId peer, const proto::Message& message);
  void SendError(net::PeerId peer, uint64_t request_id, proto::ErrorCode code, const std::string& text);
  // The ERROR code for a failure of this node's own (not of the request): kExhausted when its
  // budget is spent (the client can tell "full" from "broken"), else kInternal.
  static proto::ErrorCode OwnFailureCode(const Status& st) {
    return st.code() == StatusCode::kResourceExhausted ? proto::ErrorCode::kExhausted : proto::ErrorCode::kInternal;
  }
  void Refuse(net::PeerId peer, const std::string& why);  // REQUIRES: mu held
  // Answers a FETCH (SEND) with FETCH_OK for `info` and starts sending `send` (hold and bytes set).
  void StartBulkSend(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info,
                     std::shared_ptr<BulkSend> send);
  void PumpBulkSend(const std::shared_ptr<BulkSend>& send);

  // --- fan-out (node_fanout.cc) ---
  // FETCH (SEND) of a version still arriving here; NotFound if there is none.
  void FetchIncoming(net::PeerId peer, const proto::Fetch& m);
  // A FETCH offering a base this node holds, for a version arriving as a delta: parked until the
  // commit (then answered as any FETCH: a delta if it pays). false: serve it as it lands.
  bool ParkForDelta(net::PeerId peer, const proto::Fetch& m);
  void RedoFetch(net::PeerId peer, const proto::Fetch& m);  // progress thread, takes mu
  void SendIncomingLocked(net::PeerId peer, const std::string& model);  // to a late joiner, if any
  // Registers `state` as arriving and sends INCOMING to the subscribers that asked (Receive, Produce).
  void AnnounceIncoming(const std::shared_ptr<IncomingVersion::State>& state);
  // False (and `send` parked until more bytes land, or failed if the version aborted) when the
  // next chunk of a send that forwards an incoming version has not landed yet.
  bool NextChunkReady(const std::shared_ptr<BulkSend>& send);
  void Resume(std::vector<std::shared_ptr<BulkSend>> sends);  // progress thread
  // Ends an incoming version that will not complete; peers forwarding it get ERROR Aborted.
  void AbortIncoming(const std::shared_ptr<IncomingVersion::State>& state, const std::string& why);
  void AbortSends(const std::shared_ptr<IncomingVersion::State>& state);  // progress thread
  void HandleStats(net::PeerId peer, const proto::Stats& m);
  void QueueSpare(uint64_t size);
  void DropIncoming();  // at shutdown: breaks send <-> state cycles before the host tier goes
  void FinishClientPublish(net::PeerId peer, uint64_t request_id, std::string model, WriteLease lease,
                           uint64_t step, int64_t publish_ns);

  // --- tiers (node_tiers.cc) ---
  // FETCH (LEASE) of a listed version that is no longer in memory: loads its file into a segment
  // on the loader thread and answers with a lease on it. REQUIRES: mu held.
  void LeaseFromFile(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info);
  // Writes one version to the file tier (flusher thread); `retry`: of a failed flush.
  void FlushNow(const std::pair<std::string, uint64_t>& key, uint64_t size, bool retry);
  // Drops failed flushes' pins, oldest first, until `more` bytes fit the budget; each version
  // that no tier holds then is de-listed with a warning. REQUIRES: mu held.
  void MakeRoomLocked(uint64_t more);
  void DropUnflushedLocked(std::map<std::pair<std::string, uint64_t>, ReadLease>::iterator it, const char* why);

  // --- catalog (REQUIRES: mu held) ---
  NodeStats StatsLocked() const;
  std::optional<proto::VersionInfo> FindLocked(const std::string& model, uint64_t version) const;
  // A read hold on the version: from the host tier, or from the lease its queued flush holds.
  Result<ReadLease> AcquireLocked(const std::string& model, uint64_t version);
  // Drops catalog entries that no tier holds (memory, a pinned flush, the file tier), warning for
  // each one that retention did not retire, and segment replicas of versions no longer in memory.
  void PruneLocked(const std::string& model);
  uint64_t ReserveLocked(const std::string& model);
  Result<proto::VersionInfo> CommitVersion(WriteLease lease, proto::VersionInfo info);
  void QueueFlush(const proto::VersionInfo& info);
  Status Recover();
  // --- shared registry (node_registry.cc) ---
  Status StartRegistry();
  std::vector<proto::VersionInfo> CatalogSnapshot() const;  // takes mu
};

namespace internal {
// The length of the snapshot header [0, 8 + N) at the start of `bytes`; 0 if it does not fit.
inline uint64_t HeaderLength(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) return 0;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian u64, as the format says
  return n <= bytes.size() - 8 ? 8 + n : 0;
}

// Segment prefix of a node: options.segment_prefix, followed by a hash of the store directory
// when there is one, so that only a node restarted on the same store adopts (and removes) the
// segments a killed node left (node_adopt.cc).
std::string SegmentPrefixFor(const NodeOptions& options);
// What AdoptStaleSegments did: how many versions it wrote, and the segments of sealed versions it
// could not write (the file tier failed: a full disk, ...), which HostTier::Open must keep so that
// a later start can try again, with the highest such version per model, which new versions must
// be numbered above.
struct Adoption {
  size_t adopted = 0;
  std::set<std::string> kept;
  std::map<std::string, uint64_t> kept_versions;
};
// Writes every sealed version found in segments of dead processes with `prefix` to `files`
// (unless it holds that version already). The segments stay for HostTier::Open to remove, but
// for those in Adoption::kept.
Adoption AdoptStaleSegments(const std::string& prefix, mode_t mode, FileTier& files);
}  // namespace internal

}  // namespace viper
