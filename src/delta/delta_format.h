// The delta stream's records (docs/PROTOCOL.md "Delta stream"), shared by encoder and decoder.
// Little-endian host assumed (x86-64, aarch64), as the rest of the wire format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "viper/delta.h"

namespace viper::delta_internal {

inline constexpr uint32_t kMagic = 0x544C4456;  // "VDLT" as little-endian bytes
inline constexpr size_t kBlockRecordBytes = 28;  // before the payload
inline constexpr uint8_t kFlagBase = 1;          // residual is XORed onto base[base_offset ..]
inline constexpr uint8_t kFlagZstd = 2;          // SPARSE payload is a zstd frame (after a u32 raw size)
inline constexpr uint8_t kPlaneZero = 0, kPlaneRaw = 1, kPlaneZstd = 2;
// Since format version 2: the plane as a bitmap of its nonzero bytes + those bytes, each raw or a
// zstd frame. Header: u32 count (nonzero bytes, 1..n), u8 bitmap coding, u8 values coding (0 raw,
// 1 zstd), u16 reserved (0), u32 bitmap bytes; then the bitmap ((n + 7) / 8 bytes decoded, bit
// i % 8 of byte i / 8 set iff byte i of the plane is nonzero, bits past n zero), then the values
// (the rest of the plane's bytes; `count` bytes decoded).
inline constexpr uint8_t kPlaneBitmap = 3;
inline constexpr size_t kBitmapHeaderBytes = 12;
inline constexpr uint8_t kCodingRaw = 0, kCodingZstd = 1;
inline constexpr size_t kPlaneHeaderBytes = 5;  // u8 kind, u32 bytes

// Block record header: u8 method, u8 width, u8 flags, u8 reserved (0), u32 length,
// u64 target_offset, u64 base_offset (0 without kFlagBase), u32 payload_bytes.
struct BlockRecord {
  uint8_t method = 0;
  uint8_t width = 1;
  uint8_t flags = 0;
  uint8_t reserved = 0;
  uint32_t length = 0;
  uint64_t target_offset = 0;
  uint64_t base_offset = 0;
  uint32_t payload_bytes = 0;
};

template <typename T>
inline void Put(std::vector<std::byte>& out, T v) {
  size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

template <typename T>
inline T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Writes the record at p (kBlockRecordBytes bytes).
inline void StoreBlockRecord(std::byte* p, const BlockRecord& r) {
  std::memcpy(p, &r.method, 1);
  std::memcpy(p + 1, &r.width, 1);
  std::memcpy(p + 2, &r.flags, 1);
  p[3] = std::byte{0};
  std::memcpy(p + 4, &r.length, 4);
  std::memcpy(p + 8, &r.target_offset, 8);
  std::memcpy(p + 16, &r.base_offset, 8);
  std::memcpy(p + 24, &r.payload_bytes, 4);
}

// REQUIRES: p has kBlockRecordBytes bytes.
inline BlockRecord LoadBlockRecord(const std::byte* p) {
  BlockRecord r;
  r.method = Load<uint8_t>(p);
  r.width = Load<uint8_t>(p + 1);
  r.flags = Load<uint8_t>(p + 2);
  r.reserved = Load<uint8_t>(p + 3);
  r.length = Load<uint32_t>(p + 4);
  r.target_offset = Load<uint64_t>(p + 8);
  r.base_offset = Load<uint64_t>(p + 16);
  r.payload_bytes = Load<uint32_t>(p + 24);
  return r;
}

}  // namespace viper::delta_internal
