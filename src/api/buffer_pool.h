// BufferPool: receive buffers reused across versions. A buffer handed out returns to the pool when
// its last reference drops (e.g. when the last reader lets go of an old version). Memory is
// anonymous mmap with MADV_HUGEPAGE, pre-faulted when mapped (PrefaultForWrite): a transfer that
// faults as it lands pays ~1.8 GB/s page filling on the receiving thread. KeepSpare() maps the second
// buffer of a double-buffered subscriber ahead of the second version, on a thread of the caller's
// choosing: the buffer is free (Acquire can take it) while it is still being populated.
// Thread-safe; buffers may outlive the pool.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "viper/status.h"

namespace viper::internal {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t max_free) : max_free_(max_free) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool() {
    for (auto& b : free_) Unmap(b);
  }

  struct Lease {
    std::shared_ptr<const void> owner;  // returns the buffer to the pool when the last copy drops
    std::span<std::byte> data;          // exactly the size asked for
  };

  // A buffer of at least `size` bytes: the smallest free one that fits (and is not more than twice
  // too big), else a new, pre-faulted mapping.
  Result<Lease> Acquire(size_t size) {
    Buffer buffer = TakeFree(size);
    if (buffer.data == nullptr) {
      VIPER_ASSIGN_OR_RETURN(buffer, Map(size));
    }
    std::weak_ptr<BufferPool> weak = weak_from_this();
    auto owner = std::shared_ptr<const void>(buffer.data, [weak, buffer](const void*) {
      if (auto pool = weak.lock()) return pool->Return(buffer);
      Unmap(buffer);
    });
    return Lease{std::move(owner), std::span<std::byte>(buffer.data, size)};
  }

  // Maps and pre-faults one free buffer for `size` unless one fits already or the pool has made
  // two or more buffers (leased or free): what a subscriber needs for the next version while
  // readers hold the live one, without growing past double buffering on its own. The buffer joins
  // the free list as soon as it is mapped and is populated there: an Acquire meanwhile takes it
  // at once (a version that arrives during the populate does not wait for it, nor make a third
  // buffer) and may write into it while the populate goes on, because populating never changes
  // a byte (MADV_POPULATE_WRITE; without it, a locked add of zero per page).
  Status KeepSpare(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (mapped_ >= 2 || FindFreeLocked(size) != free_.size()) return Status::OK();
      mapped_++;  // counted now: a concurrent KeepSpare makes no second spare
    }
    const size_t capacity = std::max<size_t>(size, 4096);
    void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      Status err = Status::FromErrno("spare receive buffer: mmap of " + std::to_string(capacity) + " bytes");
      std::lock_guard<std::mutex> lock(mu_);
      mapped_--;
      return err;
    }
    ::madvise(p, capacity, MADV_HUGEPAGE);
    Buffer buffer{static_cast<std::byte*>(p), capacity};
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(buffer);
      populating_ = buffer.data;  // never unmapped while this runs (see Return)
    }
    if (auto& hook = PopulateHookForTesting()) hook(std::span<std::byte>(buffer.data, capacity));
    PopulateInPlace(buffer.data, capacity);
    std::lock_guard<std::mutex> lock(mu_);
    populating_ = nullptr;
    return Status::OK();
  }

  // Testing: called by KeepSpare before it populates the spare (a test blocks it to hold the
  // populate open). Process-wide; set it before any pool is used and clear it afterwards.
  static std::function<void(std::span<std::byte>)>& PopulateHookForTesting() {
    static std::function<void(std::span<std::byte>)> hook;
    return hook;
  }

  size_t mapped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return mapped_;
  }

 private:
  struct Buffer {
    std::byte* data = nullptr;
    size_t capacity = 0;
  };

  size_t FindFreeLocked(size_t size) const {
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= size && free_[i].capacity <= 2 * size + (1 << 20) &&
          (best == free_.size() || free_[i].capacity < free_[best].capacity))
        best = i;
    }
    return best;
  }

  Buffer TakeFree(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = FindFreeLocked(size);
    if (best == free_.size()) return {};
    Buffer buffer = free_[best];
    free_.erase(free_.begin() + static_cast<long>(best));
    return buffer;
  }

  Result<Buffer> Map(size_t size) {
    size_t capacity = std::max<size_t>(size, 4096);
    void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Status::FromErrno("receive buffer: mmap of " + std::to_string(capacity) + " bytes");
    ::madvise(p, capacity, MADV_HUGEPAGE);
    PrefaultForWrite(p, capacity);
    std::lock_guard<std::mutex> lock(mu_);
    mapped_++;
    return Buffer{static_cast<std::byte*>(p), capacity};
  }

  static void Unmap(Buffer b) { ::munmap(b.data, b.capacity); }

  // Faults every page in without changing its bytes, in 64 MiB steps (another thread may be
  // receiving into the buffer meanwhile). Best effort, like PrefaultForWrite.
  static void PopulateInPlace(std::byte* p, size_t n) {
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif
    constexpr size_t kStep = size_t{64} << 20;
    for (size_t off = 0; off < n; off += kStep) {
      const size_t len = std::min(kStep, n - off);
      if (::madvise(p + off, len, MADV_POPULATE_WRITE) == 0) continue;
      if (errno != EINVAL) return;  // out of memory: the rest faults in as it is written
      for (size_t i = 0; i < len; i += 4096) __atomic_fetch_add(reinterpret_cast<unsigned char*>(p + off + i), 0, __ATOMIC_RELAXED);
    }
  }

  void Return(Buffer b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    while (free_.size() > max_free_) {  // drop the oldest, but never the spare being populated
      size_t victim = free_.front().data == populating_ ? 1 : 0;
      Unmap(free_[victim]);
      free_.erase(free_.begin() + static_cast<long>(victim));
      mapped_--;
    }
  }

  const size_t max_free_;
  mutable std::mutex mu_;
  std::vector<Buffer> free_;
  size_t mapped_ = 0;  // mappings alive that this pool made and will get back (free + leased)
  std::byte* populating_ = nullptr;  // the spare KeepSpare is populating (in free_ or leased)
};

}  // namespace viper::internal
