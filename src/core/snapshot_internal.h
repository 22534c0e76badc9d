// Helpers shared by the snapshot reader (snapshot.cc) and writer (snapshot_layout.cc).
// Internal to viper_core: not installed, not part of the API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace viper::internal {

inline constexpr size_t kNpos = static_cast<size_t>(-1);

// Offset of the first byte that does not start a valid UTF-8 sequence (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or kNpos if `text` is valid.
size_t FirstInvalidUtf8(std::string_view text);

// `text` in double quotes for an error message: quotes, backslashes and control bytes escaped,
// cut at a character boundary after about `max_bytes` bytes ("..." marks the cut). Untrusted
// names can be megabytes long and contain terminal escapes; messages stay one short line.
std::string Quote(std::string_view text, size_t max_bytes = 64);

// "[2, 3, 4]"
std::string ShapeString(const std::vector<int64_t>& shape);

// Element count of a shape (1 for a scalar, 0 if any dim is 0); nullopt on u64 overflow.
// REQUIRES: no negative dim.
std::optional<uint64_t> ElementCount(const std::vector<int64_t>& shape);

// The bytes a view of the tensor spans if each zero dim were 1: its nonzero dims times
// `elem_size`; nullopt above 2^63-1. Numpy and torch compute strides and sizes in signed 64 bits
// even for an empty tensor, so a valid shape keeps this within 2^63-1 ([0, 2^62, 2^62] does not).
// REQUIRES: no negative dim.
std::optional<uint64_t> StrideSpan(const std::vector<int64_t>& shape, size_t elem_size);

inline uint64_t RoundUp(uint64_t value, uint64_t alignment) {  // REQUIRES: power of two
  return (value + alignment - 1) & ~(alignment - 1);
}

inline uint64_t LoadLe64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

inline void StoreLe64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i, v >>= 8) p[i] = static_cast<std::byte>(v & 0xff);
}

}  // namespace viper::internal
