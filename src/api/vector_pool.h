// VectorPool: byte vectors reused across delta transfers. A vector handed out returns to the pool
// when its last reference drops, keeping its capacity and so its faulted pages: the next delta's
// parts are appended (node) or received (client) into memory that is already mapped, without page
// faults or reallocation. On this machine kind a delta's parts in fresh memory cost the encoder
// ~4x the CPU of the same encode into reused memory (docs/ARCHITECTURE.md "Delta updates").
//
// The pool keeps free vectors up to `budget` bytes of capacity (set_budget: e.g. what one delta
// needs); beyond that a returned vector is freed. Thread-safe; vectors may outlive the pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace viper::internal {

class VectorPool : public std::enable_shared_from_this<VectorPool> {
 public:
  using Bytes = std::vector<std::byte>;

  explicit VectorPool(size_t budget) : budget_(budget) {}
  VectorPool(const VectorPool&) = delete;
  VectorPool& operator=(const VectorPool&) = delete;

  // An empty vector (size 0) with at least `reserve` bytes of capacity: the smallest free one
  // that has it, else a new one (growing a free one would move it to fresh memory anyway).
  std::shared_ptr<Bytes> Acquire(size_t reserve) {
    std::unique_ptr<Bytes> v;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto fit = std::lower_bound(free_.begin(), free_.end(), reserve,
                                  [](const std::unique_ptr<Bytes>& f, size_t c) { return f->capacity() < c; });
      if (fit != free_.end()) {
        v = std::move(*fit);
        free_.erase(fit);
        free_bytes_ -= v->capacity();
      }
    }
    if (!v) {
      v = std::make_unique<Bytes>();
      v->reserve(reserve);
    }
    v->clear();
    std::weak_ptr<VectorPool> weak = weak_from_this();
    return std::shared_ptr<Bytes>(v.release(), [weak](Bytes* p) {
      std::unique_ptr<Bytes> owned(p);
      if (auto pool = weak.lock()) pool->Return(std::move(owned));
    });
  }

  // Free vectors beyond `budget` bytes of capacity are dropped from now on (and at once).
  void set_budget(size_t budget) {
    std::lock_guard<std::mutex> lock(mu_);
    budget_ = budget;
    TrimLocked();
  }

  size_t free_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_bytes_;
  }

 private:
  void Return(std::unique_ptr<Bytes> v) {
    std::unique_ptr<Bytes> drop;  // freed outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    if (free_bytes_ + v->capacity() > budget_) {
      drop = std::move(v);
      return;
    }
    free_bytes_ += v->capacity();
    // Sorted by capacity: Acquire takes the smallest that fits.
    auto at = std::lower_bound(free_.begin(), free_.end(), v->capacity(),
                               [](const std::unique_ptr<Bytes>& f, size_t c) { return f->capacity() < c; });
    free_.insert(at, std::move(v));
  }

  void TrimLocked() {
    while (!free_.empty() && free_bytes_ > budget_) {
      free_bytes_ -= free_.front()->capacity();
      free_.erase(free_.begin());
    }
  }

  mutable std::mutex mu_;
  size_t budget_;
  size_t free_bytes_ = 0;
  std::vector<std::unique_ptr<Bytes>> free_;  // by capacity, ascending
};

}  // namespace viper::internal
