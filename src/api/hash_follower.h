// HashFollower: computes the checksum of a data region from the bytes being copied into it, one
// chunk behind the copy. The producer copies a model into its segment on one core while the
// publisher's hash thread hashes the *source* chunk the copy has just read, on the other: the
// chunk is still in cache, so the checksum costs no second trip to memory and is ready about when
// the copy is (docs/ARCHITECTURE.md "Copy and checksum run side by side").
//
// The region is described as pieces (where each tensor's source bytes land) with zeros between
// and after them, exactly what the copy produces in a segment whose padding Begin() zeroed; the
// digest equals checksum64 of the finished region.
//
// Protocol: the writer copies the region front to back and calls Advance(end) after each piece
// (bytes [0, end) are copied, so the hash may read their source); Run() (on the hash thread)
// returns after hashing the whole region and fulfils result(). The writer must Advance to
// region_size eventually, even on error paths, or Run() waits forever; the source bytes must not
// change until result() is ready.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <future>
#include <span>
#include <vector>

#include "viper/snapshot.h"

namespace viper::internal {

class HashFollower {
 public:
  struct Piece {
    uint64_t offset = 0;                // where the bytes land in the region
    std::span<const std::byte> bytes;   // the source they are copied from
  };

  // REQUIRES: pieces sorted by offset, not overlapping, inside [0, region_size).
  HashFollower(uint64_t region_size, std::vector<Piece> pieces)
      : region_size_(region_size), pieces_(std::move(pieces)), result_(promise_.get_future().share()) {}

  std::shared_future<uint64_t> result() const { return result_; }

  // Writer side: bytes [0, end) of the region are copied. `end` never decreases.
  void Advance(uint64_t end) {
    ready_.store(end, std::memory_order_release);
    ready_.notify_one();
  }

  // Hash-thread side.
  void Run() {
    Checksum64Stream stream;
    uint64_t hashed = 0;
    while (hashed < region_size_) {
      uint64_t ready = ready_.load(std::memory_order_acquire);
      if (ready == hashed) {
        ready_.wait(hashed, std::memory_order_acquire);
        continue;
      }
      HashRange(stream, hashed, ready);
      hashed = ready;
    }
    promise_.set_value(stream.Digest());
  }

 private:
  // Feeds region bytes [from, to) to the stream: source bytes inside pieces, zeros between them.
  // Called with consecutive ranges, so the piece cursor only moves forward.
  void HashRange(Checksum64Stream& stream, uint64_t from, uint64_t to) {
    static constexpr std::array<std::byte, 4096> kZeros{};
    while (from < to) {
      while (next_ < pieces_.size() && pieces_[next_].offset + pieces_[next_].bytes.size() <= from) ++next_;
      uint64_t stop = to;
      if (next_ < pieces_.size() && pieces_[next_].offset <= from) {
        const Piece& piece = pieces_[next_];
        stop = std::min(to, piece.offset + piece.bytes.size());
        stream.Update(piece.bytes.subspan(from - piece.offset, stop - from));
      } else {
        if (next_ < pieces_.size()) stop = std::min(to, pieces_[next_].offset);
        stop = std::min(stop, from + kZeros.size());
        stream.Update(std::span<const std::byte>(kZeros.data(), stop - from));
      }
      from = stop;
    }
  }

  const uint64_t region_size_;
  const std::vector<Piece> pieces_;
  size_t next_ = 0;  // hash thread only
  std::atomic<uint64_t> ready_{0};
  std::promise<uint64_t> promise_;
  std::shared_future<uint64_t> result_;
};

}  // namespace viper::internal
