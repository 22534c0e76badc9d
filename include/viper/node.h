// Node: a Viper server. Owns a host tier (shared-memory segments), an optional file tier, a UCX
// engine with a listener, and the embedded registry (catalog of models, versions and replicas,
// plus pub/sub). Runs embedded in a Publisher or standalone (`viper serve`); a Relay
// (include/viper/relay.h) feeds one from another node.
//
// Announce after complete: a version is registered and NOTIFY goes to subscribers only after every
// byte is in the host tier and its checksum is computed. Subscribers are sent each new version as
// it completes; a slow subscriber coalesces them (it loads only the newest, see Subscriber).
// A peer's leases are dropped when it releases them or when its connection dies.
//
// Thread-safety: all public methods are thread-safe. Message handling runs on the engine's progress
// thread; verification of client publishes and file flushes run on the node's own worker threads.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/delta_policy.h"
#include "viper/host_tier_stats.h"
#include "viper/metrics.h"
#include "viper/registry.h"
#include "viper/status.h"
#include "viper/version_info.h"

namespace viper {

// The tiers (src/store/host_tier.h, src/store/file_tier.h) are in-tree only: Node names them for
// the Publisher and Relay built on it.
class FileTier;
class HostTier;
class WriteLease;
struct NodeTestHooks;

struct NodeOptions {
  std::string listen = "127.0.0.1:0";  // loopback unless told otherwise; port 0 = any free port
  // The host other hosts reach this node at (a name or an address), which address() reports and
  // the registry and replica lists carry, with the bound port. Empty: the listen address or, for
  // 0.0.0.0 / :: (every interface), this host's: its name's address if that is one of this host's
  // non-loopback addresses, else the first non-loopback address of an interface that is up.
  std::string advertise;
  std::string name;                    // shown to peers; default "node-<pid>"
  std::filesystem::path store_dir;     // file tier directory; empty = no file tier
  size_t keep_host_versions = 2;       // versions per model kept in shared memory
  size_t keep_file_versions = 3;       // versions per model kept on the file tier
  mode_t segment_mode = 0600;          // owner-only unless configured
  // Memory budget of the host tier (HostTierOptions::max_bytes / max_models): the shared memory
  // the node's segments may take (0 = half of /dev/shm) and how many models it holds there. A
  // publish or relay beyond it fails with ResourceExhausted (`viper serve --host-max-bytes
  // --host-max-models`).
  uint64_t host_max_bytes = 0;
  size_t host_max_models = 128;
  mode_t file_mode = 0600;
  std::string token;                   // when set, every peer's HELLO must carry it
  // Listening beyond loopback without a token lets anyone who reaches the port publish, fetch and
  // announce; Start refuses it unless this is set (viper serve --insecure).
  bool insecure = false;
  bool recover = true;                 // on start, load each model's latest file into memory
  // Shared memory that versions not yet on the file tier keep beyond keep_host_versions: queued
  // flushes, and failed ones (a full disk) until a retry writes them. Past it the oldest failed
  // one is dropped and, held by no tier then, de-listed with a warning naming it.
  uint64_t unflushed_budget_bytes = 2ull << 30;
  // Liveness of the node's peers (consumers, relays, publishers): one from which nothing came for
  // peer_liveness_probe is pinged (by the engine, answered by every peer's engine); if it does not
  // answer within peer_liveness_timeout it is dropped as if it had disconnected: its leases go,
  // it is no longer listed as a relay of the versions it relays, transfers to it end; a peer on
  // this host is kept while its process lives (a frozen one may still read what its leases pin).
  // A host cut off without FIN or RST is otherwise noticed only when TCP gives up (minutes).
  // 0: never pinged (`viper serve --peer-liveness SECONDS` sets both; NodeStats::peers_silent).
  std::chrono::milliseconds peer_liveness_probe{5000};
  std::chrono::milliseconds peer_liveness_timeout{5000};
  // A peer with which none of this node's pending bulk transfers completes for this long is
  // dropped like a silent one (NodeStats::peers_stalled): it answers pings, but a client that asks
  // for versions (SEND) and never receives them would pin their segments for ever, and one that
  // starts a PUBLISH and never sends the bytes would hold the segment it got. 0: never. A
  // transfer's chunks complete at the link's pace, one (4 MiB by default) at a time, so the
  // default allows a link 300 times slower than 1 Mbit/s per chunk.
  std::chrono::milliseconds peer_transfer_stall{120000};
  uint32_t chunk_bytes = 4u << 20;     // bulk transfer chunk size (a client may ask for another)
  uint32_t chunks_in_flight = 8;       // bulk sends outstanding per transfer
  // Shared-memory segments are /dev/shm/<prefix>.<pid>.<n>. With a store_dir the prefix becomes
  // "<segment_prefix>-<hash of store_dir>": a node restarted on that store after a crash finds the
  // segments its killed predecessor left, keeps every sealed version in them (written to the file
  // tier if it is not there yet) and removes them; other nodes leave them alone.
  std::string segment_prefix = "viper";
  // Delta transfers (docs/ARCHITECTURE.md "Delta updates"): a consumer that fetches over the
  // network and holds one of the last `delta_bases` versions before the newest gets a delta
  // against it (`delta` says when). Each base pins one snapshot in shared memory beyond
  // keep_host_versions; delta_bases 0 is the same as kOff (`viper serve --delta --delta-bases`).
  DeltaMode delta = DeltaMode::kAuto;
  size_t delta_bases = 1;
  size_t delta_threads = 2;  // encoder threads (the parts of one delta are encoded side by side)
  // A relay passes a delta it receives on as it arrives, part by part, to peers that offer the
  // same base (IncomingVersion::ForwardDeltaPart); false: it encodes its own once the version is
  // complete here (the behaviour before; kept to measure against).
  bool forward_deltas = true;
  // Testing only (src/api/test_hooks.h): calls into the node's internals. Leave null.
  std::shared_ptr<const NodeTestHooks> test_hooks;
  // Shared registry the node registers its versions in (include/viper/registry.h): "" = none (the
  // node's own catalog only, served to consumers that connect by address), "embedded" (this
  // process), or "redis://HOST:PORT[/DB]". An unreachable registry is a warning, not an error:
  // the node serves what it holds and registers when the registry comes back.
  std::string registry;
  // Redis AUTH password of `registry` (ReadRegistryPasswordFile reads one with a secret file's
  // hygiene); empty = none.
  std::string registry_password;
  RegistryHeartbeat registry_heartbeat;  // TTL of the node's records and how often they are put again
  // Called for every subscriber's ACK (the version is live at that subscriber), on the engine
  // thread with the node's lock held: must be quick and must not call the node. The embedded
  // Publisher uses it to measure t_c for its Scheduler.
  std::function<void(const std::string& model, uint64_t version)> on_ack;
};

// Identity of this host for "is shared memory reachable, and is a peer's pid a process here": boot
// id + network, mount and pid namespaces (network namespaces stand in for separate hosts in tests;
// a process in a pid namespace of its own, as in most containers, is served as a remote peer).
std::string LocalHostKey();
// CLOCK_REALTIME in nanoseconds: comparable across processes on one host.
int64_t WallClockNs();

// A relay's link to its upstream, summed over the models it relays (zero on a node that relays
// nothing): what `viper stats` shows of a relay that waits for its upstream or sits on an alternate.
struct UpstreamStats {
  uint64_t subscriptions = 0;      // models relayed
  uint64_t connected = 0;          // ...connected to a node now
  uint64_t on_preferred = 0;       // ...to RelayOptions::upstream itself (not an alternate)
  uint64_t connect_failures = 0;   // connection attempts that reached no node
  uint64_t preferred_returns = 0;  // moves from an alternate back to the upstream
  uint64_t liveness_failures = 0;  // upstream connections given up: the upstream stopped answering
};

struct NodeStats {
  uint64_t versions_committed = 0;
  uint64_t notifies_sent = 0;
  uint64_t leases_granted = 0;
  uint64_t leases_active = 0;
  uint64_t peers = 0;
  uint64_t models = 0;  // models this node tracks: with versions, or subscribed to
  // Connections refused: at the listener's handshake (no or wrong token, timed out, evicted by
  // newer ones, malformed; broken down below) and peers dropped later (wrong protocol version,
  // too many bad messages).
  uint64_t peers_refused = 0;
  uint64_t handshakes_refused_token = 0;
  uint64_t handshakes_timed_out = 0;
  uint64_t handshakes_evicted = 0;
  uint64_t handshakes_malformed = 0;
  uint64_t peers_silent = 0;  // peers dropped because they stopped answering (peer_liveness_probe)
  uint64_t peers_stalled = 0;  // ...because no bulk transfer with them completed (peer_transfer_stall)
  uint64_t malformed_messages = 0;
  uint64_t files_flushed = 0;
  uint64_t flush_errors = 0;
  // Egress of version bytes to peers (SEND), counted as each chunk's send completes: what a
  // producer's node pays per update, the figure fan-out keeps near one model size.
  uint64_t bytes_sent = 0;
  uint64_t bytes_sent_incoming = 0;  // ...of them sent while the version was still arriving here
  uint64_t incoming_versions = 0;    // versions received through Receive (a relay's transfers)
  uint64_t incoming_aborted = 0;     // ...whose transfer broke before Commit (receivers got ERROR Aborted)
  uint64_t produced_early = 0;       // versions announced while the producer still wrote them (Produce)
  // Versions waiting for the file tier; each pins its segment until written (bounded by bytes,
  // not by count: a slow disk makes it grow).
  uint64_t flushes_queued = 0;
  // Versions whose flush failed (a full disk) kept in memory until a retry writes them, and their
  // bytes (within NodeOptions::unflushed_budget_bytes).
  uint64_t unflushed_versions = 0;
  uint64_t unflushed_bytes = 0;
  uint64_t versions_delisted = 0;  // listed versions lost (no tier held them any more), each logged
  uint64_t leases_from_file = 0;   // same-host leases of versions loaded back from the file tier
  HostTierStats host;  // the host tier's segments by state
  DeltaStats delta;
  // Latency histograms: publish() (PublishInfo's publish_ns, the producer's clock) to the NOTIFY
  // sent here; a FETCH answered by SEND to its last chunk sent (for a version still arriving
  // here, the wait for its bytes included).
  LatencyHistogram publish_live;
  LatencyHistogram fetch_send;
  UpstreamStats upstream;
};
// The counters by name ("bytes_sent", ...), as STATS_REPLY carries them; the histograms as
// "hist_NAME_us_le_BOUND" and "hist_NAME_us_sum" (AddHistogramCounters).
std::map<std::string, uint64_t> StatsCounters(const NodeStats& stats);

class IncomingVersion;

// A copy of a model's versions in GPU memory on this node's host (GpuPublisher provides one; see
// docs/ARCHITECTURE.md "GPU-resident versions"). The node lists its live version in NOTIFY as a
// kDevice replica and leases it to same-host peers (FETCH in kDevice mode) exactly as it leases a
// segment: the buffer is not reused while leased; RELEASE, or the peer's disconnection, ends the
// lease. Called with the node's lock held: must be quick and must not call the node.
class DeviceReplicaSource {
 public:
  virtual ~DeviceReplicaSource() = default;
  virtual int device() const = 0;
  // The version live on the device now (0: none yet).
  virtual uint64_t live_version() const = 0;
  // Leases the live version if it is `version` (0: whichever is live): the 128-byte GPU version
  // message (include/viper/gpu_store.h). NotFound naming both versions when another is live.
  virtual Result<std::string> Lease(uint64_t version) = 0;
  virtual void Release(const std::string& message) = 0;  // a message Lease returned
};

class Node {
 public:
  static Result<std::unique_ptr<Node>> Start(const NodeOptions& options);
  // What the Relay feeding this node reports of its upstream link (NodeStats::upstream).
  void SetUpstreamStats(const UpstreamStats& upstream);
  ~Node();  // stops the engine first (no more handlers), then drains flushes, then releases tiers
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  std::string address() const;   // "host:port" peers connect to (advertised: NodeOptions::advertise)
  std::string listen_address() const;  // "host:port" it listens on (a wildcard stays one)
  const std::string& host_key() const { return host_key_; }
  const NodeOptions& options() const { return options_; }

  // --- Local publishing (used by the embedded Publisher) ---
  // Reserves the next version number of `model` (greater than any in memory or on file).
  Result<uint64_t> ReserveVersion(const std::string& model);
  // A writable segment of `size` bytes (recycled when one fits).
  Result<WriteLease> Allocate(uint64_t size);
  // Registers a complete, sealed version and announces it. `info` must carry model, version,
  // size, checksum, step and publish_ns; completed_ns is filled in here, and this node's own
  // replicas (segment, node) are listed first, ahead of any replicas `info` already names (a
  // relay keeps its upstream's: the producer's node and its file).
  // REQUIRES: the bytes in `lease` are a sealed snapshot of info.size bytes.
  Result<proto::VersionInfo> Commit(WriteLease lease, proto::VersionInfo info);
  // A version arriving from another node (a relay's transfer), received straight into a segment
  // of this node and forwarded while it arrives: see IncomingVersion. Subscribers that asked
  // (SUBSCRIBE with kSubscribeIncoming) get INCOMING at once. `info` is the upstream's (model,
  // version, size, checksum, ...); a Receive of a version already arriving replaces (aborts) the
  // earlier one. Errors: InvalidArgument (bad model, version 0, size < 8), FailedPrecondition
  // (this node already holds the version or a newer one), ResourceExhausted (no segment).
  // by_delta: the bytes are decoded from a delta as they arrive; a peer that offers a base this
  // node holds then waits for the commit and gets a delta (or the full version, as the delta
  // decision says) instead of the full bytes as they land.
  Result<std::unique_ptr<IncomingVersion>> Receive(proto::VersionInfo info, bool by_delta = false);
  // A version this process writes into `lease` itself, announced before it is complete: the
  // producer's cut-through (the embedded Publisher's copy; GpuPublisher's device -> pinned chunk
  // copies advance the same watermark). Subscribers that asked (kSubscribeIncoming:
  // consumers and relays on other hosts) get INCOMING at once with checksum 0; a FETCH (SEND) of it
  // is answered FETCH_OK kFullSealedLater and served chunk by chunk as IncomingVersion::Landed
  // passes them; IncomingVersion::Seal then sends the checksum and the final header (SEALED), and
  // Commit makes it a version of this node like any other. Nothing that maps or lists sees it
  // before Commit. `info` carries model, version (reserved here), size, step, publish_ns and
  // metadata; its checksum is ignored. Errors: InvalidArgument (bad model, version 0, a lease of
  // another size, a header [0, 8 + N) that does not fit or exceeds proto::kMaxSealedHeaderBytes).
  // REQUIRES: the lease's first 8 + N bytes hold the snapshot's header (provisional: Seal sends
  // the final one), N as the final header's (SnapshotLayout reserves it), padding zeroed.
  Result<std::unique_ptr<IncomingVersion>> Produce(WriteLease lease, proto::VersionInfo info);
  // Whether a version produced now would be read early: a subscriber of `model` asked for INCOMING.
  bool HasEarlyReaders(const std::string& model) const;

  // Registers `source` as the device copy of `model` (nullptr removes it; the peers' leases on the
  // old source are released as they end). One source per model.
  void SetDeviceReplicas(const std::string& model, std::shared_ptr<DeviceReplicaSource> source);
  // A version live on the model's device copy before the host tier has it (GpuPublisher calls this
  // as soon as the GPU copy completes). `info` carries model, version, size, step, publish_ns and
  // metadata; checksum 0 (not computed yet). The node lists only its kDevice replica, seals it,
  // sends it as a NOTIFY to the same-host subscribers that asked (SUBSCRIBE with kSubscribeDevice)
  // and serves FETCH kDevice of it under the usual lease rules until the host tier commits it
  // (whose NOTIFY then goes to every subscriber). A no-op without a device copy of the model, or
  // for a version not above the model's latest.
  void AnnounceDevice(proto::VersionInfo info);

  // --- Catalog ---
  std::optional<proto::VersionInfo> Latest(const std::string& model) const;
  std::vector<proto::VersionInfo> List() const;
  // Calls `fn` once the delta of (model, version) against the previous version is encoded, or at
  // once with prepared = false if none is being made. `fn` runs on the encoder thread or the
  // caller's; it must be quick and must not call the node.
  void WhenDeltaPrepared(const std::string& model, uint64_t version, std::function<void(const PreparedDelta&)> fn);
  // Blocks until every queued file-tier flush is done (or the timeout expires).
  Status WaitFlushed(std::chrono::milliseconds timeout = std::chrono::minutes(10));
  NodeStats stats() const;

  HostTier& host_tier();
  FileTier* file_tier();  // nullptr without store_dir

 private:
  friend class IncomingVersion;
  struct Impl;
  explicit Node(const NodeOptions& options);
  NodeOptions options_;
  std::string host_key_;
  std::shared_ptr<Impl> impl_;
};

// IncomingVersion: a version being written into a segment of its node by one writer (a relay's
// transfer), served to peers while it arrives: a peer's FETCH (SEND) of it gets chunk i as soon as
// Landed() covers it, so a chain of relays forwards each chunk while still receiving the rest.
// Consumers of the node never see it until Commit: NOTIFY, LIST and leases are for complete
// versions only. Destroying it without Commit aborts it: peers receiving it get ERROR Aborted
// (their receivers abandon the transfer and fall back), and its segment returns to the pool once
// the last send that reads it is done.
//
// Thread-safety: one writer thread calls data/Landed/Commit; the node serves peers meanwhile.
// REQUIRES: destroyed before its Node.
class IncomingVersion {
 public:
  ~IncomingVersion();  // aborts unless committed
  IncomingVersion(const IncomingVersion&) = delete;
  IncomingVersion& operator=(const IncomingVersion&) = delete;

  std::span<std::byte> data() const;       // info.size bytes to fill
  const proto::VersionInfo& info() const;  // as announced in INCOMING (this node listed first)
  // The first `bytes` bytes are final (monotonic; larger values than before only); for a version
  // not sealed yet, except its header, which Seal sends again.
  void Landed(uint64_t bytes);
  // Whether the checksum is known (Receive of a complete upstream version; after Seal). A version
  // from Node::Produce, or relayed from one still being written upstream, is not sealed until Seal.
  bool sealed() const;
  // The version is complete and its header [0, 8 + N) final in data(): `final` carries the
  // checksum, step, publish_ns and metadata to commit. Peers whose transfer started before
  // (FETCH_OK kFullSealedLater) are sent SEALED with the final header; later FETCHes get the
  // final info at once. OK and nothing done if already sealed. Errors: FailedPrecondition
  // (aborted, bytes still missing), InvalidArgument (model, version or size differ from info()).
  Status Seal(const proto::VersionInfo& final);
  // For a version received as a delta (Receive with by_delta): part `index` of the delta stream,
  // against base (base_version, base_checksum), as it arrived from the upstream and before it is
  // decoded. Parts come in order, 0 first; `last` marks the final one. A peer that offers the
  // same base gets these parts as they come (no encode here, no wait for the commit); one with
  // another base still waits for the commit. Ignored when deltas or forward_deltas are off, or
  // once the version aborted; a part out of order stops the forwarding (its peers fall back).
  void ForwardDeltaPart(uint64_t base_version, uint64_t base_checksum, uint32_t index,
                        std::shared_ptr<const std::vector<std::byte>> part, bool last);
  // Registers and announces the version like Node::Commit (upstream's replicas kept after ours).
  // REQUIRES: every byte landed, sealed, and the caller verified the checksum. Errors as
  // Node::Commit; on error the version is aborted.
  Result<proto::VersionInfo> Commit();

  struct State;  // shared with the node's sends (src/api/node_impl.h)

 private:
  friend class Node;
  explicit IncomingVersion(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  bool committed_ = false;
};

}  // namespace viper
