// SegmentMappings: a subscriber's read-only mappings of its node's shared-memory segments, kept
// from one version to the next. Internal to src/api (the map and copy paths of the subscriber).
//
// A node recycles a few segments per model (keep_host_versions + 1 and a spare), so the next
// version usually arrives in a segment this process has mapped before. A fresh mmap of it would
// start with empty page tables: the first read of every 64 KiB (the kernel's fault-around) traps,
// and the munmap of the last version's mapping clears them again. For 315 MB that was 55-60 ms of
// faults in the consumer's copy (205 ms against 145 ms from a warm mapping, torch copy_) and
// 25-70 ms of munmap, on every version. A kept mapping costs nothing after the first version in
// its segment. The first one is not populated here (MADV_POPULATE_READ): that moved the faults
// onto the fetch, where a 315 MB populate took 0.1-0.8 s under load and taught the subscriber's
// path estimator that mapping is slow.
//
// Identity: a segment is its inode (st_dev, st_ino), not its name, and the open descriptor kept
// with each mapping pins the inode, so a number cannot be reused under a kept mapping. A segment
// its node unlinked (retention, shutdown) is dropped at the next Map() or Prune(): its memory goes
// once the versions that still hold the mapping are gone. At most `max_segments` are kept (least
// recently used dropped first).
//
// Thread-safe. Mapped bytes are read-only; whether they hold a given version is the node's lease,
// which the caller holds as before (a kept mapping is not a lease).
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/fd.h"
#include "store/host_tier.h"
#include "viper/status.h"

namespace viper::internal {

class SegmentMappings {
 public:
  explicit SegmentMappings(size_t max_segments = 8) : max_segments_(max_segments < 1 ? 1 : max_segments) {}
  SegmentMappings(const SegmentMappings&) = delete;
  SegmentMappings& operator=(const SegmentMappings&) = delete;

  struct Stats {
    uint64_t mapped = 0;  // segments mapped here
    uint64_t reused = 0;  // Map() calls served by a kept mapping
  };

  // The first `size` bytes of segment `name`, read-only. Errors as OpenSegmentReadOnly
  // (InvalidArgument for a bad name, a segment smaller than `size` or one that is not a regular
  // file, NotFound, PermissionDenied for another user's segment).
  Result<MappedSegment> Map(const std::string& name, uint64_t size) {
    struct stat st {};
    VIPER_ASSIGN_OR_RETURN(Fd fd, OpenSegmentReadOnly(name, size, &st));
    std::lock_guard<std::mutex> lock(mu_);
    PruneLocked();
    for (auto& e : entries_) {
      if (e->dev != st.st_dev || e->ino != st.st_ino || e->length < size) continue;
      e->last_use = ++tick_;
      stats_.reused++;
      return MappedSegment{e->owner, std::span<const std::byte>(e->base, size)};
    }
    // The whole segment: a later version in it may be larger than this one.
    const uint64_t length = static_cast<uint64_t>(st.st_size);
    void* base = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd.get(), 0);
    const int err = errno;
    if (base == MAP_FAILED) {
      return Status::FromErrno("segment " + name + ": mmap of " + std::to_string(length) + " bytes failed", err);
    }
    auto e = std::make_shared<Entry>();
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->fd = std::move(fd);
    e->base = static_cast<const std::byte*>(base);
    e->length = length;
    e->owner = std::shared_ptr<const void>(base, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
    e->last_use = ++tick_;
    stats_.mapped++;
    if (entries_.size() >= max_segments_) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if ((*it)->last_use < (*oldest)->last_use) oldest = it;
      entries_.erase(oldest);
    }
    entries_.push_back(e);
    return MappedSegment{e->owner, std::span<const std::byte>(e->base, size)};
  }

  // Drops the mappings of segments that were unlinked (the node let them go).
  void Prune() {
    std::lock_guard<std::mutex> lock(mu_);
    PruneLocked();
  }

  // Drops every kept mapping (versions that hold one keep it until they go).
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }

  size_t kept() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    Fd fd;  // pins the inode while the mapping is kept
    const std::byte* base = nullptr;
    uint64_t length = 0;  // bytes mapped (the segment's size when mapped)
    uint64_t last_use = 0;
    std::shared_ptr<const void> owner;  // unmaps when the last version holding it goes
  };

  void PruneLocked() {
    std::erase_if(entries_, [](const std::shared_ptr<Entry>& e) {
      struct stat st {};
      return ::fstat(e->fd.get(), &st) != 0 || st.st_nlink == 0;
    });
  }

  const size_t max_segments_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Entry>> entries_;
  uint64_t tick_ = 0;
  Stats stats_;
};

}  // namespace viper::internal
