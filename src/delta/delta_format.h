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

inline void PutBlockRecord(std::vector<std::byte>& out, const BlockRecord& r) {
  Put<uint8_t>(out, r.method);
  Put<uint8_t>(out, r.width);
  Put<uint8_t>(out, r.flags);
  Put<uint8_t>(out, 0);
  Put<uint32_t>(out, r.length);
  Put<uint64_t>(out, r.target_offset);
  Put<uint64_t>(out, r.base_offset);
  Put<uint32_t>(out, r.payload_bytes);
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
