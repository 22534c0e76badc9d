// Subscriber::Impl: the subscriber's private state, shared by the .cc files that implement the
// subscriber. Include only from src/api.
//
// Locking: `mu` guards everything declared after it; the loader thread (Run) owns the fetch and
// takes `mu` only to read announcements and to publish results.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <atomic>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "api/client.h"
#include "buffer_pool.h"
#include "path_estimator.h"
#include "segment_mappings.h"
#include "task_queue.h"
#include "viper/registry.h"
#include "viper/subscriber.h"

namespace viper {

// The start of ModelVersion::reason for a version received while its node still wrote it (FETCH_OK
// kFullSealedLater: the producer's cut-through, or a relay forwarding such a version).
inline constexpr std::string_view kSealedLaterReason = "cut-through (received as the node wrote it, sealed last)";

struct Subscriber::Impl : std::enable_shared_from_this<Subscriber::Impl> {
  SubscriberOptions options;
  std::shared_ptr<internal::BufferPool> pool;
  internal::PathEstimator estimator;
  // The node's segments mapped by the map and copy paths, kept between versions (segment_mappings.h).
  internal::SegmentMappings mappings;
  // The live version. A mutex rather than std::atomic<std::shared_ptr>: libstdc++ 12 implements
  // that with a lock bit ThreadSanitizer cannot see, and every read here is rare and short.
  class LiveSlot {
   public:
    std::shared_ptr<const ModelVersion> load() const {
      std::lock_guard<std::mutex> lock(mu_);
      return value_;
    }
    void store(std::shared_ptr<const ModelVersion> v) {
      std::lock_guard<std::mutex> lock(mu_);
      value_ = std::move(v);
    }

   private:
    mutable std::mutex mu_;
    std::shared_ptr<const ModelVersion> value_;
  } live;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::shared_ptr<Client> client;  // replaced when the connection is lost
  std::string node_address;        // the node `client` is connected to (options.connect or an alternate)
  std::shared_ptr<std::atomic<bool>> client_current;  // false once `client` is replaced: its announcements stop
  bool unreachable_reported = false;                  // no node reachable, and that was logged
  std::string chosen_unreachable;  // options.choose_node: the node the last connect did not reach
  // The node a liveness probe just gave up on (CheckLiveness): the next reconnect tries it last
  // (with choose_node: reports it unreachable), since a connect to it waits out the timeout.
  std::string silent_node;
  std::optional<std::string> reported_node;           // the last node told to options.on_connection
  std::optional<proto::VersionInfo> announced;
  bool announced_incoming = false;  // announced by INCOMING: the node is still receiving it
  bool announced_device_only = false;  // by a device-only NOTIFY (options.gpu_early): no host bytes yet
  int64_t announced_ns = 0;
  uint64_t failed_version = 0;     // the last version whose load failed on every path
  // The failed version was still arriving at the node (INCOMING): it is loaded again once a node
  // announces it complete (OnAnnounce; on a reconnect the node's first NOTIFY does), not on every
  // reconnect: the node that aborted it may have nothing to send (its producer abandoned it).
  bool failed_awaits_complete = false;
  uint64_t loading_version = 0;    // the version Run is loading (0 between loads)
  // The receive buffer of a transfer that broke midway: receives may still be posted into it, so
  // it returns to the pool only after the client (and its engine) that posted them is gone.
  std::shared_ptr<const void> poisoned_buffer;
  // Connections this subscriber replaced that are still alive because mapped versions hold them
  // (their leases live on that connection), each with the buffer a broken transfer on it may
  // still receive into: the buffer is safe again only once that connection is gone.
  std::vector<std::pair<std::weak_ptr<Client>, std::shared_ptr<const void>>> retired_buffers;
  // Loader thread only: other nodes that held versions of the model (relays, from the replica
  // lists of NOTIFYs), newest first. A remote transfer that breaks is retried from them before the
  // file tier: a relay holds each version soon after it is announced, often before the NOTIFY we
  // got listed it.
  std::vector<std::string> other_nodes;
  // Loader thread only: the remote transfer of the version being loaded that broke midway, kept
  // for the next holder tried to finish from its landed prefix (subscriber_resume.cc).
  struct Partial {
    TransferPrefix prefix;
    internal::BufferPool::Lease buffer;  // owns prefix.buffer: a pooled buffer or the landing zone
    ProgressFn landed;                   // the landing zone's callback (e.g. a relay forwarding it)
    std::string from;                    // the node the prefix came from (first) and its size then
    uint64_t first_landed = 0;
    // Connections whose engines may still receive into the buffer (a broken transfer's receives
    // stay posted until its engine is gone): the buffer is reused only after they are closed.
    std::vector<std::shared_ptr<Client>> posted;
  };
  std::optional<Partial> partial;
  bool closing = false;
  // With options.registry (subscriber_registry.cc): the node the registry named (to connect to
  // next), and whether an outage of the registry was reported already.
  std::string registry_node;
  std::string registry_node_host_key;
  bool registry_down = false;
  std::vector<std::function<void(const std::shared_ptr<const ModelVersion>&)>> callbacks;
  // Held while callbacks run (the loader's calls and OnUpdate's call with the live version), so
  // that every callback sees versions in order and each one once. Taken before `mu`, never inside.
  std::mutex deliver_mu;
  SubscriberStats stats;
  Status last_error;
  std::thread loader;
  // Makes the spare receive buffer after each version (BufferPool::KeepSpare), so that a version
  // announced meanwhile is fetched at once instead of waiting for the populate. Closed before
  // the pool can go (the task holds the pool).
  std::unique_ptr<internal::TaskQueue> spare;
  // On an alternate (options.alternates): options.connect is probed on this thread, not the
  // loader's, because a connect to a node that is frozen or cut off waits out the engine's connect
  // timeout (5 s) and versions announced meanwhile must still load. A connection the probe made
  // waits in `probed` until the loader adopts it between versions. Null without alternates.
  std::unique_ptr<internal::TaskQueue> prober;
  bool probe_in_flight = false;
  std::unique_ptr<Client> probed;
  std::shared_ptr<std::atomic<bool>> probed_current;  // the handlers' flag of `probed`
  std::chrono::steady_clock::time_point next_preferred_probe{};  // loader thread only
  // Set once in Start, before the loader runs; the watch is destroyed in Close.
  std::string host_key;
  std::unique_ptr<Registry> registry;
  std::unique_ptr<RegistryWatch> registry_watch;

  // --- GPU (subscriber_gpu.cc), with options.gpu_device >= 0; loader thread only ---
  struct GpuState;
  std::shared_ptr<GpuState> gpu;
  Status StartGpu();  // in Start: Unavailable without a GPU
  // Sets mv.device: from the producer's device copy if `announced` lists one here, else from the host bytes.
  Status PlaceOnDevice(ModelVersion& mv, const proto::VersionInfo& announced);
  // mv with an empty snapshot: a device-only version (the layout is read from the device copy).
  Status PlaceFromProducer(ModelVersion& mv, Client& client, const std::shared_ptr<Client>& connection);
  // A version announced device-only (options.gpu_early): live from the producer's GPU copy alone.
  Result<std::shared_ptr<ModelVersion>> LoadDeviceOnly(const proto::VersionInfo& info);
  // A remote transfer staged on the GPU while it arrives: each landed piece of the data region is
  // copied host-to-device at once, so the last chunk's copy is all that is left when the bytes are
  // verified. Null when the version will not be placed from host bytes (no GPU, or a GPU copy on
  // this host that PlaceOnDevice opens instead).
  class DeviceStaging;
  std::shared_ptr<DeviceStaging> StageOnDevice(const proto::VersionInfo& announced, Client& client);
  // The transfer's progress: bytes [0, landed) of the version's `total` are in `received`.
  static void StageReceived(DeviceStaging& staging, std::span<const std::byte> received, uint64_t landed, uint64_t total);
  // After the transfer's bytes verified into mv: mv.device from the staged copy, if every byte of
  // mv's data region was staged (else it logs why and PlaceOnDevice copies the region whole).
  void FinishStaging(DeviceStaging& staging, ModelVersion& mv);

  // NOTIFY (complete at the node) or INCOMING (still arriving there: pipelined).
  // A version announced by `holder` (empty: the connected node). With a token, a version whose
  // seal does not verify is skipped with a warning (seal.h).
  void OnAnnounce(const proto::VersionInfo& info, bool incoming, const std::string& holder = "");
  // Drops (with a warning each) the holders whose version's seal does not verify.
  void DropUnsealed(RegistryLookup* found) const;
  // --- shared registry (subscriber_registry.cc) ---
  Status StartRegistry();
  void OnRegistryAnnounce(const HolderRecord& record);
  void OnRegistryError(const Status& why);
  void Rediscover();  // looks the model up, feeds the newest version to OnAnnounce
  // The node the registry named, then the nearest other holders; sets *address to the one reached.
  // The named node is tried last if it is `last` (a node that went silent).
  Result<std::unique_ptr<Client>> ConnectViaRegistry(const ClientHandlers& handlers, std::string* address,
                                                     const std::string& last = "");
  Result<std::shared_ptr<Client>> EnsureClient();
  ClientHandlers HandlersFor(std::shared_ptr<std::atomic<bool>> current);
  Result<std::shared_ptr<Client>> Adopt(std::unique_ptr<Client> fresh, const std::string& address,
                                        std::shared_ptr<std::atomic<bool>> current);
  void ReportConnection(const std::string& node);
  // On an alternate: starts a probe of options.connect on `prober` unless one is in flight.
  // REQUIRES: mu held.
  void ProbePreferredLater();
  // Moves to the connection a probe made, if there is one. Called between versions, without mu.
  void AdoptProbed();
  // Pings the node if it has been silent for options.liveness_probe; drops the connection if it
  // does not answer in options.liveness_timeout. Called between versions, without `mu` held.
  void CheckLiveness();
  std::string CurrentNode();
  void WaitConnected(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready);
  ClientOptions ClientOptionsFor(const std::string& node) const;
  void DropClient(const std::shared_ptr<Client>& broken);
  void Run();
  Result<std::shared_ptr<ModelVersion>> Load(const proto::VersionInfo& info);
  // Whether a version newer than `info` is known: announced already or, asking `client` (if
  // connected), held by the node (then announced here as if NOTIFY had come: the node may retire a
  // version and answer a FETCH of it before its NOTIFY of the newer one is out). A load that the
  // node refuses as gone (NotFound: the version, or the delta's base, was retired) and that is
  // replaced is not retried on another path nor in full: it is skipped (SubscriberStats::skipped).
  bool Replaced(const proto::VersionInfo& info, Client* client);
  std::vector<internal::PathChoice> RankPaths(const proto::VersionInfo& info, Client* client);
  Result<std::shared_ptr<ModelVersion>> LoadVia(FetchPath path, const proto::VersionInfo& info,
                                                const std::shared_ptr<Client>& client);
  // map/copy under a lease. A mapped version keeps `client` alive: the node drops a connection's
  // leases with it, and a segment without a lease may be recycled under the readers.
  Result<std::shared_ptr<ModelVersion>> LoadLeased(FetchPath path, const proto::VersionInfo& info,
                                                   const std::shared_ptr<Client>& client);
  // `shared`: the owner of `client` if the connection outlives this call (it is then kept with a
  // buffer its broken transfer may still receive into); null for a connection made for the call.
  Result<std::shared_ptr<ModelVersion>> LoadRemote(const proto::VersionInfo& info, Client& client,
                                                   const std::shared_ptr<Client>& shared = nullptr);
  // --- resume (subscriber_resume.cc) ---
  // Finishes `partial` (same version) from `client`: FETCH with the landed prefix's offset.
  Result<std::shared_ptr<ModelVersion>> LoadResumed(const proto::VersionInfo& info, Client& client,
                                                    const std::shared_ptr<Client>& shared);
  // Keeps what a broken transfer landed (prefix non-empty) for the next holder to finish.
  void KeepPartial(TransferPrefix prefix, internal::BufferPool::Lease buffer, ProgressFn landed,
                   const std::string& from, const std::shared_ptr<Client>& shared);
  // Drops an unfinished partial: its buffer waits (retired_buffers) for the connections that may
  // still receive into it.
  void DropPartial();
  // Where a remote version is received: the landing zone if one is set (with its `landed`
  // callback for the prefix received), else a pooled buffer.
  // delta_base: the transfer is a delta against it (a landing zone then takes its parts as they
  // arrive into *delta_part, where one is given).
  Result<std::span<std::byte>> ReceiveBuffer(const proto::VersionInfo& actual, internal::BufferPool::Lease* buffer,
                                             ProgressFn* landed, const DeltaBase* delta_base = nullptr,
                                             DeltaPartFn* delta_part = nullptr);
  // subscriber_delta.cc: the remote fetch that offers the live version as a delta base (the node
  // answers with a delta or the full snapshot). nullopt when there is no base to offer (or deltas
  // are off); retry_in_full when a delta failed (did not decode or verify, or the node gave it
  // up) and the connection can fetch the full snapshot instead.
  struct DeltaAttempt {
    Result<std::shared_ptr<ModelVersion>> result;
    bool retry_in_full = false;
  };
  std::optional<DeltaAttempt> LoadRemoteDelta(const proto::VersionInfo& info, Client& client,
                                              const std::shared_ptr<Client>& shared);
  // Makes the pool's spare buffer on the spare thread, off the fetch path.
  void KeepSpareLater(uint64_t size);
  Result<std::shared_ptr<ModelVersion>> LoadFromOtherNode(const std::string& node, const proto::VersionInfo& info);
  void AddOtherNodeChoices(const proto::VersionInfo& info, std::vector<internal::PathChoice>& ranked);
  Result<std::shared_ptr<ModelVersion>> LoadFile(const proto::VersionInfo& info);
  // `hashed`: the data region's checksum if it was computed while the bytes arrived.
  Status Finish(ModelVersion& mv, std::span<const std::byte> bytes, std::shared_ptr<const void> owner, bool verify,
                std::optional<uint64_t> hashed = std::nullopt);
};

}  // namespace viper
