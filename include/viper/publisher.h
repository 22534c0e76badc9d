// Publisher: the producer-side API. Embeds a Node and publishes versions of one model.
//
// Modes (PublisherOptions::mode):
//  - kSync: Publish() returns when the version is in the host tier, sealed and announced.
//  - kAsync (default): Publish() copies the tensors into a (recycled) segment and returns; sealing
//    (header), announcing and the file flush run on a background thread in publish order.
//    The caller's stall is the copy alone; the checksum is computed by the background seal.
//  - kSync: while Publish() copies, a hash thread checksums what is already copied, so the
//    checksum costs little beyond the copy on a machine with a second core. Publishing again while earlier versions are in flight queues them (FIFO, at most
//    max_in_flight; beyond that Publish() waits). Wait() joins everything queued.
//  - zero-copy: Begin() hands out writable views of each tensor inside a segment; Commit() seals
//    and announces (sync or async as the mode says). The stall is then only the seal.
// Every Publish/Commit reports the producer stall it caused (the time the caller was blocked).
//
// Thread-safety: Publish/Begin/Commit/Wait may be called from any thread; versions are numbered
// in the order Publish/Commit is called.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "viper/node.h"
#include "viper/scheduler.h"
#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper {

enum class PublishMode { kSync, kAsync };
Result<PublishMode> ParsePublishMode(std::string_view name);  // "sync" | "async"
std::string_view publish_mode_name(PublishMode mode);          // "sync" | "async"

struct PublisherOptions {
  std::string model;               // REQUIRED: see ValidateModelName
  NodeOptions node;                // the embedded node (listen address, store_dir, token, ...)
  PublishMode mode = PublishMode::kAsync;
  uint64_t alignment = 64;         // tensor alignment in the snapshot (1 = gap-free), a power of two <= kMaxAlignment
  size_t max_in_flight = 2;        // async versions queued before Publish() blocks
  // Cut-through (docs/ARCHITECTURE.md "Cut-through from the producer"): while a remote reader
  // (a consumer or relay on another host) is subscribed, Publish() announces each version before
  // it copies it, and the reader receives chunks as they are copied; the checksum and the final
  // header follow the copy. Commit() of a draft announces it at once, and the reader receives it
  // while the seal computes its checksum. false: a version is announced only once committed.
  bool cut_through = true;
  // Optional checkpoint policy (the online Inference Performance Predictor). When set, Due() and
  // PublishIfDue() ask it, and the publisher feeds it the costs it measures: every publish's
  // stall (t_p), and for every subscriber ACK the time from the end of that publish's stall until
  // the version was live there (t_c). NodeOptions::on_ack is taken for this.
  std::shared_ptr<Scheduler> scheduler;
};

struct PublishInfo {
  uint64_t step = 0;
  std::optional<double> loss;
  std::map<std::string, std::string> metadata;  // user keys (not "viper.*")
};

struct PublishResult {
  uint64_t version = 0;
  int64_t stall_ns = 0;     // how long the caller was blocked
  int64_t copy_ns = 0;      // of which copying tensors into the segment
  bool recycled = false;    // the segment was recycled (fast path)
  uint64_t bytes = 0;       // snapshot size
  // The delta the node prepares for this version against the previous one, for the consumers
  // that fetch over the network (docs/ARCHITECTURE.md "Delta updates"): it is encoded in the
  // background after the commit, so get() waits for that encode (never for a consumer). Not
  // prepared (prepared = false, why_not says why) for a first version, while no consumer fetches
  // over the network, with deltas off, or when the publish failed.
  std::shared_future<PreparedDelta> delta;
};

// A version being written in place (zero-copy mode). Move-only; destroying it without Commit
// abandons the version (nothing is announced; the segment returns to the pool).
class Draft {
 public:
  Draft();
  Draft(Draft&&) noexcept;
  Draft& operator=(Draft&&) noexcept;
  ~Draft();
  // Writable bytes of tensor `name` (empty span if unknown).
  std::span<std::byte> tensor(std::string_view name) const;
  const SnapshotLayout& layout() const { return *layout_; }
  uint64_t version() const { return version_; }

 private:
  friend class Publisher;
  std::shared_ptr<const SnapshotLayout> layout_;
  std::unique_ptr<WriteLease> lease_;  // the segment being written (src/store/host_tier.h)
  // Publish() with remote readers: the version, announced while it is copied (cut-through), owns
  // the segment instead of lease_; version_ is then reserved already.
  std::shared_ptr<IncomingVersion> early_;
  bool early_recycled_ = false;  // the segment early_ took was recycled
  uint64_t version_ = 0;
  int64_t publish_ns = 0;
  std::shared_future<uint64_t> checksum_;  // valid when Publish hashed the data while copying it
};

class Publisher {
 public:
  static Result<std::unique_ptr<Publisher>> Start(const PublisherOptions& options);
  ~Publisher();  // waits for queued publishes, then stops the node

  // Publishes one version made of `tensors` (copied once, into the segment).
  Result<PublishResult> Publish(const std::vector<TensorData>& tensors, const PublishInfo& info = {});
  // Makes a segment for versions laid out like `tensors` (with `metadata`) on a background thread
  // and returns at once, so that the first Publish() copies into memory already faulted in
  // instead of creating the segment on the caller's thread (later segments are made between
  // publishes anyway). A Publish() that finds it still being made waits for it. Call it once,
  // before training starts. InvalidArgument for a layout Begin() refuses.
  Status Prepare(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata = {});
  // Zero-copy: a version laid out for `tensors`, to be filled in place and committed.
  Result<Draft> Begin(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata = {});
  Result<PublishResult> Commit(Draft draft, const PublishInfo& info = {});
  // With options.scheduler: records the loss of `iteration` and says whether a checkpoint is due
  // (Scheduler::Step). FailedPrecondition without a scheduler; InvalidArgument as Step().
  Result<bool> Due(int64_t iteration, double loss);
  // Due(), then Publish() with step = iteration and loss set if it is: the training loop's one
  // call. nullopt when no checkpoint is due.
  Result<std::optional<PublishResult>> PublishIfDue(int64_t iteration, double loss,
                                                    const std::vector<TensorData>& tensors, PublishInfo info = {});
  // Waits until every queued version is announced; returns the first background error since the
  // last Wait (or OK).
  Status Wait(std::chrono::milliseconds timeout = std::chrono::minutes(10));

  std::string address() const { return node_->address(); }
  Node& node() { return *node_; }
  const PublisherOptions& options() const { return options_; }
  // Latest version announced so far to every subscriber (0 if none): a Publish/Commit once it is
  // committed, a GpuPublisher's version once its host copy is (GpuPublisher::WaitHost).
  uint64_t announced_version() const;

 private:
  friend class GpuPublisher;  // NoteAnnounced and KeepSpareLater, at its host commits
  struct Impl;
  void NoteAnnounced(uint64_t version);
  // After a commit of `size` bytes: the host tier's next segment made on the spare thread
  // (HostTier::KeepSpare), so that the next version recycles instead of faulting in a fresh one.
  void KeepSpareLater(uint64_t size);
  Publisher(const PublisherOptions& options, std::unique_ptr<Node> node);
  struct DeltaPromise;
  // Cut-through applies to `draft`: on, a remote reader subscribed, the header small enough to
  // follow in SEALED.
  bool AnnouncesEarly(const Draft& draft) const;
  Status AnnounceEarly(Draft& draft, const PublishInfo& info);
  // Commit's metadata must be what Begin laid out (InvalidArgument naming the key).
  Status CheckCommitMetadata(const Draft& draft, const PublishInfo& info) const;
  proto::VersionInfo VersionInfoOf(const Draft& draft, const PublishInfo& info, uint64_t checksum) const;
  // `order`: held from the reservation of an early version's number (Publish) until it is queued,
  // so that versions are sealed in number order; taken here if not held.
  Result<PublishResult> Enqueue(Draft draft, const PublishInfo& info, int64_t started_ns, int64_t copy_ns,
                                std::unique_lock<std::mutex> order);
  PublisherOptions options_;
  std::unique_ptr<Node> node_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace viper
