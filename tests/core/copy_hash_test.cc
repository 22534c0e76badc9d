// StreamingCopy (src/core/memory.h) and HashFollower (src/api/hash_follower.h): the copy is
// bit-exact for every size and alignment its loops split on, and the checksum a hash thread
// computes from the source pieces, one step behind a copy, equals checksum64 of the region the
// copy produced.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "hash_follower.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + i / 251 + seed * 17 + 7) & 0xff);
  return out;
}

TEST(StreamingCopy, BitExactAcrossSizesAndAlignments) {
  // Sizes around the 16-byte head, the 64-byte line and the 16 KiB four-page block.
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, 63, 64, 65, 4095, 16383, 16384, 16385, 16384 * 3 + 100, 1 << 20};
  const std::vector<std::byte> src = Pattern((1 << 20) + 64, 1);
  for (size_t size : sizes) {
    for (size_t dst_shift : {0, 1, 8, 15, 16, 33}) {
      for (size_t src_shift : {0, 3, 16}) {
        std::vector<std::byte> dst(size + 128, std::byte{0xEE});
        StreamingCopy(std::span(dst).subspan(dst_shift, size), std::span(src).subspan(src_shift, size));
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_shift, src.data() + src_shift, size))
            << "size " << size << " dst+" << dst_shift << " src+" << src_shift;
        for (size_t i = 0; i < dst_shift; ++i) ASSERT_EQ(dst[i], std::byte{0xEE}) << "wrote before dst, size " << size;
        for (size_t i = dst_shift + size; i < dst.size(); ++i) ASSERT_EQ(dst[i], std::byte{0xEE}) << "wrote past dst, size " << size;
      }
    }
  }
}

// The publisher's shape: tensors at aligned offsets, zero padding between and after them, copied
// in chunks by this thread while the hash thread follows.
TEST(HashFollower, ChecksumOfSourcePiecesEqualsChecksumOfCopiedRegion) {
  const std::vector<size_t> tensor_sizes = {0, 3, 100000, 64, 5 << 20, 7, 0, 1 << 20};
  std::vector<std::vector<std::byte>> tensors;
  std::vector<uint64_t> offsets;
  uint64_t end = 0;
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    end = (end + 63) / 64 * 64;  // aligned like SnapshotLayout
    offsets.push_back(end);
    tensors.push_back(Pattern(tensor_sizes[i], static_cast<int>(i)));
    end += tensor_sizes[i];
  }
  const uint64_t region_size = end + 40;  // trailing padding
  for (uint64_t chunk : {uint64_t{1000}, uint64_t{1} << 20, uint64_t{64} << 20}) {
    std::vector<std::byte> region(region_size, std::byte{0});
    std::vector<internal::HashFollower::Piece> pieces;
    for (size_t i = 0; i < tensors.size(); ++i) pieces.push_back({offsets[i], tensors[i]});
    internal::HashFollower follower(region_size, pieces);
    std::thread hasher([&] { follower.Run(); });
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (uint64_t at = 0; at < tensors[i].size(); at += chunk) {
        uint64_t n = std::min<uint64_t>(chunk, tensors[i].size() - at);
        StreamingCopy(std::span(region).subspan(offsets[i] + at, n), std::span(tensors[i]).subspan(at, n));
        follower.Advance(offsets[i] + at + n);
      }
    }
    follower.Advance(region_size);
    const uint64_t followed = follower.result().get();
    hasher.join();
    EXPECT_EQ(followed, checksum64(region)) << "chunk " << chunk;
  }
}

TEST(HashFollower, ChangedSourceByteChangesChecksum) {
  std::vector<std::byte> a = Pattern(300000, 3);
  auto hash = [](std::span<const std::byte> bytes) {
    internal::HashFollower follower(bytes.size() + 100, {{50, bytes}});
    follower.Advance(bytes.size() + 100);
    follower.Run();
    return follower.result().get();
  };
  const uint64_t before = hash(a);
  a[123457] ^= std::byte{1};
  EXPECT_NE(before, hash(a));
}

}  // namespace
}  // namespace viper
