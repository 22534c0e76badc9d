// Subscriber: the consumer-side API. Connects to a node, subscribes to one model, and keeps the
// newest complete version live behind an atomic shared_ptr swap.
//
// On NOTIFY a loader thread fetches the version by the cheapest path (see FetchPath), verifies its
// checksum, and swaps it in with one atomic store. A reader that took latest() holds one whole
// version for as long as it keeps the pointer; versions it sees never go backwards. If versions
// arrive faster than they load, only the newest is loaded (no backlog). No polling: the loader
// sleeps until a NOTIFY arrives.
//
// Thread-safety: all methods are thread-safe. OnUpdate callbacks run one at a time, after the
// swap (on the loader thread; the first call may run in OnUpdate itself, see there); they must
// not call Close() or OnUpdate() on the same Subscriber.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "viper/snapshot.h"
#include "viper/status.h"
#include "viper/version_info.h"

namespace viper {

enum class FetchPath {
  kAuto,    // on the node's host map first; the other usable paths ranked by predicted time (live
            // measurements); on failure the next: same host map, copy, then remote; other host
            // remote; file (needs file_dir) last by default
  kMap,     // map the node's segment read-only under a lease (zero copy; same host only)
  kCopy,    // copy from the node's segment into our own reused buffer (same host only)
  kRemote,  // chunked UCX transfer into our own reused buffer
  kFile,    // read <file_dir>/<model>/<version>.safetensors (Start refuses it without a file_dir)
};
Result<FetchPath> ParseFetchPath(std::string_view name);  // "auto" | "map" | "copy" | "remote" | "file"
std::string_view fetch_path_name(FetchPath path);

// Advanced: where a subscriber lands remote transfers instead of its own receive buffers. A relay
// lands them straight in its node's host tier and forwards each chunk as it lands
// (IncomingVersion); map, copy and file loads still use the subscriber's own buffers.
class LandingZone {
 public:
  virtual ~LandingZone() = default;
  struct Landing {
    std::span<std::byte> bytes;                  // exactly info.size bytes
    std::shared_ptr<const void> owner;           // keeps `bytes` valid; the loaded ModelVersion holds it
    std::function<void(uint64_t prefix)> landed;  // the first `prefix` bytes are final (may be empty)
    // A delta's parts as they arrive, before they are decoded into `bytes` (LandDelta only; may be
    // empty): index from 0 in order, `last` on the final one.
    std::function<void(uint32_t index, std::shared_ptr<const std::vector<std::byte>> part, bool last)> delta_part;
  };
  // Called on the loader thread when a remote transfer of `info` starts.
  virtual Result<Landing> Land(const proto::VersionInfo& info) = 0;
  // Instead of Land when the transfer is a delta against (base_version, base_checksum), decoded
  // as it arrives (a relay then passes the delta's parts on to its own peers that offer the same
  // base, and answers others with a delta once the version is complete, not with the full bytes
  // as they land). Default: Land.
  virtual Result<Landing> LandDelta(const proto::VersionInfo& info, uint64_t base_version, uint64_t base_checksum) {
    (void)base_version;
    (void)base_checksum;
    return Land(info);
  }
};

struct SubscriberStats;

struct SubscriberOptions {
  std::string model;                    // REQUIRED
  std::string connect = "127.0.0.1:7300";  // the node (unused with a registry)
  // Nodes to subscribe through, in order, while `connect` is unreachable (e.g. a relay's upstream's
  // upstream: a chain that loses a relay re-attaches past it). A lost connection is retried, to
  // `connect` first, every second while no version is being loaded.
  std::vector<std::string> alternates;
  // Start succeeds while no node is reachable yet (a relay started before its upstream): the
  // subscriber keeps trying, `connect` first, with a backoff from 100 ms doubling to
  // `reconnect_max`, and logs once per change (unreachable, connected). false: Start fails then
  // (unless a file_dir or a registry is given).
  bool wait_for_node = false;
  std::chrono::milliseconds reconnect_max{2000};
  // While connected to an alternate, `connect` is tried this often (on a thread of its own: a
  // try that waits out the connect timeout holds no version back); when it answers the subscriber
  // moves back to it between two versions (never during a load), so a chain started all at once,
  // or whose relay restarted, returns to the shape it was given. 0: stay.
  std::chrono::milliseconds preferred_probe{1000};
  // A node whose host vanished or whose network was cut sends no FIN, and the transport does not
  // notice an idle connection's loss (measured: not within 150 s over UCX/TCP): while waiting for
  // versions, when nothing came from the node for liveness_probe, the subscriber asks it to answer
  // (a STATS request); no answer within liveness_timeout and the connection counts as lost (it
  // reconnects, to an alternate or through the registry). 0: no probes.
  std::chrono::milliseconds liveness_probe{5000};
  std::chrono::milliseconds liveness_timeout{5000};
  // Called whenever the node this subscriber is connected to changes (`node` "" = none reachable),
  // with whether it is `connect` itself and the counters after the change; on the thread that
  // (re)connects (Start's, then the loader's), with no lock of the subscriber held.
  std::function<void(const std::string& node, bool preferred, const SubscriberStats& stats)> on_connection;
  // A shared registry (include/viper/registry.h: "embedded" or "redis://HOST:PORT[/DB]"): the
  // subscriber finds the nearest node holding the model's newest version there (this host first,
  // then another), connects to it, and hears of new versions both from that node (the fast path)
  // and from the registry; each version is loaded once however often it is heard of. It may start
  // before any node holds the model. Start fails if the registry cannot be reached; later outages
  // are one warning while the node's own notifications go on. `connect` and `alternates` are not
  // used then.
  std::string registry;
  std::string registry_password;  // Redis AUTH password of `registry`; empty = none
  // Placement (a relay that names no upstream, Relay::Start): asked for the node to connect to
  // each time the subscriber (re)connects, instead of `connect`, `alternates` and `registry`, with
  // the node the previous attempt could not reach ("" if it connected, or after a lost connection:
  // the node may still be up); an error means none now (retried with the backoff above). Called
  // on the thread that connects.
  std::function<Result<std::string>(const std::string& unreachable)> choose_node;
  std::string token;
  std::string name;
  FetchPath path = FetchPath::kAuto;
  // Checksums guard bytes that crossed something that can corrupt them: the network (remote) and
  // storage (file); those are verified before a version goes live. A mapped or copied segment is
  // the node's own memory on this host, sealed by the node from those very bytes and kept
  // unchanged by the lease, so it is trusted unless verify_local is set (docs/ARCHITECTURE.md,
  // "What a subscriber verifies"). verify_checksum = false verifies nothing.
  bool verify_checksum = true;
  bool verify_local = false;            // also verify map and copy (one more pass over the bytes)
  std::filesystem::path file_dir;       // the node's store dir as seen from here (fallback; after `path` if set)
  uint32_t chunk_bytes = 4u << 20;
  std::chrono::milliseconds request_timeout{30000};
  size_t buffers = 3;                   // reused receive buffers kept (copy/remote/file paths)
  // ACK each version to the node as it is swapped in here: a producer's Scheduler reads the time
  // from its publish to the ACK as t_c. false: the application calls Ack(version) once it really
  // serves the version (e.g. after copying it into its own model), so t_c includes that copy.
  bool ack_on_live = true;
  // With its node on another host: also load versions the node is still receiving (a relay
  // forwarding them, INCOMING), chunk by chunk as they land there; such a version goes live only
  // once complete and verified, like any other. Off: only complete versions (NOTIFY) are loaded.
  bool pipelined = true;
  std::shared_ptr<LandingZone> landing;  // default: the subscriber's own buffers
  // Remote path: offer the live version to the node as the base of a delta (docs/ARCHITECTURE.md
  // "Delta updates"). A delta is decoded into a spare buffer, verified against the announced
  // checksum (always, whatever verify_checksum says) and falls back to the full snapshot if it
  // fails; the node decides whether a delta pays.
  bool delta = true;
  // GPU (docs/ARCHITECTURE.md "GPU-resident versions"). >= 0: each version is also placed in this
  // CUDA device's memory before it goes live (ModelVersion::device): device-to-device from the
  // producer's GPU copy through CUDA IPC when the node on this host lists one (a kDevice replica,
  // leased with FETCH kDevice), else host-to-device from the loaded snapshot (a CPU producer, a
  // node on another host). Double buffered: a device buffer is reused only once no ModelVersion
  // holds it. Start fails with Unavailable without a GPU. -1: host memory only.
  int gpu_device = -1;
  // With gpu_device: read the producer's device buffer in place (no copy; its lease is held as long
  // as the ModelVersion) instead of copying it into this subscriber's own device buffer.
  bool gpu_in_place = false;
  // With gpu_device, on the producer's host: a version the producer's GPU holds goes live as soon
  // as its device copy completes (a device-only NOTIFY; SUBSCRIBE with kSubscribeDevice), without
  // waiting for its host copy, checksum and commit. Such a ModelVersion has no host bytes: its
  // snapshot is empty, DeviceVersion::tensors gives the layout, info.checksum is 0 (the bytes never
  // leave this host's GPU memory; nothing is verified here). If the device copy cannot be opened,
  // the version comes through the host path once committed. Versions of a CPU producer, or of a
  // node on another host, come through the host path as usual.
  bool gpu_early = false;
};

// Per-update timings, CLOCK_REALTIME ns (comparable with the producer's on one host).
struct UpdateTimings {
  int64_t publish_ns = 0;    // producer called publish
  int64_t completed_ns = 0;  // version complete in the producer node's host tier
  int64_t notified_ns = 0;   // NOTIFY received here
  int64_t fetched_ns = 0;    // bytes available here
  int64_t verified_ns = 0;   // checksum verified
  int64_t live_ns = 0;       // swapped in
};

// A version's data region in GPU memory (SubscriberOptions::gpu_device). Tensor t (of the
// ModelVersion's snapshot) lies at `data + t.begin`, t.nbytes() bytes. Valid while held.
struct DeviceVersion {
  int device = -1;
  unsigned long long data = 0;  // CUdeviceptr in this process
  uint64_t bytes = 0;           // of the data region
  bool in_place = false;        // the producer's own buffer (CUDA IPC), read under a lease
  std::string how;              // "device-to-device from the producer's GPU (CUDA IPC)", "host-to-device (...)"
  std::vector<TensorInfo> tensors;   // the layout: tensor t at data + t.begin (as the snapshot's)
  std::shared_ptr<const void> hold;  // the buffer, or the IPC mapping and its lease
};

// One whole version as the consumer holds it. Immutable.
struct ModelVersion {
  proto::VersionInfo info;
  Snapshot snapshot;
  UpdateTimings timings;
  FetchPath path = FetchPath::kAuto;  // the path that delivered it
  std::string reason;                 // why that path (e.g. "same host: map"), and whether a delta was used
  uint64_t delta_base = 0;            // nonzero: the bytes came as a delta against this version
  uint64_t wire_bytes = 0;            // bytes received from the node (the delta or the snapshot); 0: map/copy/file
  std::shared_ptr<const DeviceVersion> device;  // with SubscriberOptions::gpu_device >= 0
  uint64_t version() const { return info.version; }
};

struct SubscriberStats {
  uint64_t notifies = 0;
  uint64_t updates = 0;        // versions swapped in
  uint64_t skipped = 0;        // announced versions never loaded because a newer one came (before
                               // their load started, or while it ran and the node retired them)
  uint64_t fetch_failures = 0;  // loads that failed on every path (a version skipped is not one)
  uint64_t deltas = 0;           // versions that came as a delta
  uint64_t delta_fallbacks = 0;  // deltas that failed (decode, verify, node gave up) and were fetched in full
  uint64_t connect_failures = 0;   // (re)connection attempts that reached no node
  uint64_t preferred_returns = 0;  // moves from an alternate back to `connect`
  uint64_t liveness_failures = 0;  // connections given up because the node did not answer a probe
  // Map and copy paths: the node's segments mapped here, and fetches that found the segment
  // already mapped by an earlier version in it (its page tables kept: no faults, no munmap).
  uint64_t segments_mapped = 0;
  uint64_t segments_reused = 0;
};

class Subscriber {
 public:
  static Result<std::unique_ptr<Subscriber>> Start(const SubscriberOptions& options);
  ~Subscriber();  // Close()

  // The live version, or nullptr before the first one.
  std::shared_ptr<const ModelVersion> latest() const;
  // Blocks until a version >= min_version is live (Timeout otherwise).
  Result<std::shared_ptr<const ModelVersion>> WaitFor(uint64_t min_version, std::chrono::milliseconds timeout);
  // Called with the live version at once (on the calling thread, before OnUpdate returns) if
  // there is one, then after each swap on the loader thread: every version that goes live after
  // the live one, in order, once each, none missed between Start and OnUpdate. A callback must
  // not call OnUpdate or Close on the same Subscriber.
  void OnUpdate(std::function<void(const std::shared_ptr<const ModelVersion>&)> callback);
  SubscriberStats stats() const;
  // The last error of a failed update (OK if none).
  Status last_error() const;
  // Tells the node that `version` of this model is now served here (with ack_on_live = false).
  // FailedPrecondition when not connected to a node.
  Status Ack(uint64_t version);
  // Stops the loader and disconnects. Versions already handed out stay valid.
  void Close();

 private:
  struct Impl;
  explicit Subscriber(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace viper
