// HashFollower: computes the checksum of a region while another thread is still writing it, one
// step behind the writer. The producer copies a model into its segment on one core while the
// publisher's hash thread hashes what is already copied on the other, so the checksum is ready
// about when the copy is (1.7 GB: copy + hash 117 ms pipelined against 228 ms one after the
// other, docs/ARCHITECTURE.md "Copy and checksum").
//
// Protocol: the writer fills the region front to back and calls Advance(end) after each piece
// (bytes [0, end) are final); Run() (on the hash thread) returns after hashing the whole region
// and fulfils result(). The writer must Advance to region.size() eventually, even on error
// paths, or Run() waits forever.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <span>

#include "viper/snapshot.h"

namespace viper::internal {

class HashFollower {
 public:
  explicit HashFollower(std::span<const std::byte> region) : region_(region), result_(promise_.get_future().share()) {}

  std::shared_future<uint64_t> result() const { return result_; }

  // Writer side. REQUIRES: `end` never decreases; StreamingCopy's fence (or a plain store) has
  // made the bytes visible; the release store below publishes them to the hash thread.
  void Advance(uint64_t end) {
    ready_.store(end, std::memory_order_release);
    ready_.notify_one();
  }

  // Hash-thread side.
  void Run() {
    Checksum64Stream stream;
    uint64_t hashed = 0;
    while (hashed < region_.size()) {
      uint64_t ready = ready_.load(std::memory_order_acquire);
      if (ready == hashed) {
        ready_.wait(hashed, std::memory_order_acquire);
        continue;
      }
      stream.Update(region_.subspan(hashed, ready - hashed));
      hashed = ready;
    }
    promise_.set_value(stream.Digest());
  }

 private:
  std::span<const std::byte> region_;
  std::atomic<uint64_t> ready_{0};
  std::promise<uint64_t> promise_;
  std::shared_future<uint64_t> result_;
};

}  // namespace viper::internal
