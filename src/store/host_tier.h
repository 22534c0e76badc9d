// HostTier: the node's pool of POSIX shared-memory segments, one snapshot per segment.
//
// Owns every segment it creates (/dev/shm/<prefix>.<pid>.<seq>, mode 0600 by default). A segment
// goes through: Allocate (writable, private to the writer) -> Commit (readable replica of one
// (model, version)) -> retired by retention -> recycled by a later Allocate of the same or a
// smaller size, or unlinked. A segment with a live ReadLease is never recycled or overwritten:
// retirement waits for the last lease. Writing into a recycled (already faulted) segment is ~8x
// faster than into a fresh one on our VMs, which is the point of the pool.
//
// The pid in the name lets Open() find segments left by a crashed process (its pid is dead) and
// unlink them. A clean destruction unlinks every segment this tier created.
//
// Fresh segments are backed with posix_fallocate before they are handed out, so that a full
// /dev/shm fails Allocate with ResourceExhausted instead of killing the writer with SIGBUS.
// Recycling picks the smallest free segment with capacity >= size, but not one more than about
// twice the size (a small version never pins a big segment); the free pool keeps at most
// max_free_segments (least recently freed are unlinked first).
//
// Thread-safety: all methods are thread-safe. A ReadLease may outlive the calling thread and even
// the HostTier (its mapping stays valid; the name is unlinked with the tier). REQUIRES: every
// WriteLease is destroyed (or committed) before the tier.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/fd.h"
#include "viper/host_tier_stats.h"
#include "viper/status.h"

namespace viper {

struct HostTierOptions {
  std::string prefix = "viper";    // segment name prefix; [A-Za-z0-9_-]+
  mode_t mode = 0600;              // owner-only unless configured
  size_t keep_versions = 2;        // committed versions kept per model (>= 1)
  size_t max_free_segments = 4;    // retired segments kept for recycling; extra ones are unlinked
  // Memory budget. max_bytes caps the capacity of every segment the tier holds (committed,
  // leased, being written and free); 0 = half the size of /dev/shm when the tier opens. An
  // Allocate that would go beyond it first unlinks free segments, then fails with
  // ResourceExhausted. max_models caps the models with a committed version; a Commit of one more
  // fails with ResourceExhausted (0 = no cap).
  uint64_t max_bytes = 0;
  size_t max_models = 128;
  bool remove_stale = true;        // Open() unlinks segments of dead processes with our prefix
  std::set<std::string> keep_stale;  // ... but these (a node's crash recovery could not save them)
  // The prefix is this tier's alone while it lives (a node with a store holds the store's lock,
  // and its prefix names the store): every segment with it found at Open is a predecessor's,
  // whatever the pid in its name (a container restarted after an OOM kill has the same pid, and a
  // pid of the name may also run some unrelated process now).
  bool prefix_is_exclusive = false;
};

class HostTier;

// A writable segment being filled by a producer. Destroying it without Commit returns the
// segment to the free pool (an aborted publish leaves nothing visible). Move-only.
class WriteLease {
 public:
  WriteLease() = default;
  WriteLease(WriteLease&&) noexcept;
  WriteLease& operator=(WriteLease&&) noexcept;
  ~WriteLease();

  std::span<std::byte> data() const { return data_; }  // exactly the requested size
  const std::string& segment_name() const;              // e.g. "viper.1234.7"
  bool recycled() const { return recycled_; }           // true if the segment was reused
  explicit operator bool() const { return tier_ != nullptr; }

 private:
  friend class HostTier;
  HostTier* tier_ = nullptr;
  uint64_t segment_id_ = 0;
  std::span<std::byte> data_;
  bool recycled_ = false;
};

// A read-only hold on a committed version: while it lives the bytes stay valid and unchanged.
// Copyable handle (shared); the hold ends when the last copy is destroyed.
class ReadLease {
 public:
  ReadLease() = default;
  std::span<const std::byte> data() const { return data_; }
  const std::string& segment_name() const { return name_; }
  const std::string& model() const { return model_; }
  uint64_t version() const { return version_; }
  explicit operator bool() const { return hold_ != nullptr; }
  // The hold itself, to tie the bytes' lifetime to another object (e.g. Snapshot::Parse owner).
  std::shared_ptr<const void> hold() const { return hold_; }

 private:
  friend class HostTier;
  std::shared_ptr<const void> hold_;
  std::span<const std::byte> data_;
  std::string name_;
  std::string model_;
  uint64_t version_ = 0;
};

class HostTier {
 public:
  static Result<std::unique_ptr<HostTier>> Open(const HostTierOptions& options = {});
  ~HostTier();  // unlinks every segment it created
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // A writable region of `size` bytes in a recycled segment if one fits, else a fresh one.
  Result<WriteLease> Allocate(uint64_t size);
  // Makes one free segment for `size` now, on the calling thread, so that a later Allocate of that
  // size recycles instead of creating and faulting in a fresh segment (seconds at 1.7 GB on our
  // VMs); an Allocate that finds this spare still being made waits for it. Does nothing if a free
  // segment fits, a spare is already being made, or the tier already holds keep_versions + 1
  // segments that fit `size` (one model's steady state). Errors: InvalidArgument (size 0),
  // ResourceExhausted (/dev/shm full; nothing is left behind).
  Status KeepSpare(uint64_t size);
  // Makes the lease's bytes the replica of (model, version) and applies retention.
  // Errors: InvalidArgument (bad model name, version 0, empty or foreign lease),
  // FailedPrecondition (version not greater than the latest committed version of `model`).
  // On error the lease's segment returns to the free pool.
  Status Commit(WriteLease lease, const std::string& model, uint64_t version);
  // Makes the lease's bytes a read-only copy of (model, version) that is not one of the tier's
  // versions: not listed, outside retention, any version number (e.g. an older version loaded back
  // from the file tier for a consumer on this host). The returned hold is its only reference: the
  // segment returns to the free pool when the last copy of it goes. Errors as Commit's, except
  // that the version need not be newer than the latest.
  Result<ReadLease> CommitDetached(WriteLease lease, const std::string& model, uint64_t version);
  // A read hold on (model, version). NotFound if it is not (or no longer) in the tier.
  Result<ReadLease> Acquire(const std::string& model, uint64_t version);
  // Latest committed version of `model`, if any.
  std::optional<uint64_t> latest(const std::string& model) const;
  std::vector<uint64_t> versions(const std::string& model) const;  // ascending
  std::vector<std::string> models() const;
  HostTierStats stats() const;
  const HostTierOptions& options() const { return options_; }

  // Names of segments with `prefix` in /dev/shm whose creating process is dead (any process, with
  // `exclusive`: see HostTierOptions::prefix_is_exclusive) and that this process's effective uid
  // owns (regular files, not links: checked with fstat on a descriptor opened O_NOFOLLOW). Entries
  // with the pattern that another user created are logged and left alone: nothing another local
  // user puts in /dev/shm is removed, mapped or adopted.
  static std::vector<std::string> FindStaleSegments(const std::string& prefix, bool exclusive = false);

 private:
  struct Impl;
  friend class WriteLease;
  explicit HostTier(const HostTierOptions& options);
  void Abort(uint64_t segment_id);
  const std::string& NameOf(uint64_t segment_id) const;

  HostTierOptions options_;
  std::unique_ptr<Impl> impl_;
};

// A read-only mapping of a segment created by another process (a consumer mapping the node's
// segment under a LEASE). `size` is the snapshot size (the segment may be larger). Errors:
// InvalidArgument (bad name, size 0, segment smaller than `size`), NotFound (no such segment).
// populate: fault every page in now (MAP_POPULATE), in one kernel pass, for a caller that reads
// all of it at once (the copy path); a zero-copy reader leaves pages to fault in on first use.
struct MappedSegment {
  std::shared_ptr<const void> owner;  // unmaps when the last reference goes
  std::span<const std::byte> data;
};
Result<MappedSegment> MapSegmentReadOnly(const std::string& name, uint64_t size, bool populate = false);

// The descriptor of segment `name` opened read-only for mapping, and its fstat in *st: a regular
// file of at least `size` bytes. The name comes from a node, but /dev/shm is shared by every user
// of the host, so what is found under it is checked: the open does not follow a link
// (O_NOFOLLOW), a FIFO planted under the name does not block it (O_NONBLOCK), and anything but a
// regular file is refused. Errors as MapSegmentReadOnly, and PermissionDenied for another user's
// segment this process may not read.
Result<Fd> OpenSegmentReadOnly(const std::string& name, uint64_t size, struct stat* st);

}  // namespace viper
