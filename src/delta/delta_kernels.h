// The delta codec's inner loops, one instantiation per element width (T = uint8_t .. uint64_t).
// Written as plain loops over memcpy'd elements so that the compiler vectorizes them (this
// directory builds with -O3); docs/ARCHITECTURE.md "Delta updates" has their measured speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace viper::delta_internal {

// r[i] = t[i] ^ b[i] over n elements; returns how many are nonzero.
template <typename T>
size_t XorCount(const std::byte* t, const std::byte* b, std::byte* r, size_t n) {
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, t + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    T v = static_cast<T>(x ^ y);
    std::memcpy(r + i * sizeof(T), &v, sizeof(T));
    nonzero += v != 0;
  }
  return nonzero;
}

template <typename T>
size_t CountNonzero(const std::byte* r, size_t n) {
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, r + i * sizeof(T), sizeof(T));
    nonzero += v != 0;
  }
  return nonzero;
}

// planes[k * n + i] = byte k of element i.
template <typename T>
void SplitPlanes(const std::byte* r, std::byte* planes, size_t n) {
  constexpr size_t W = sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, r + i * W, W);
    for (size_t k = 0; k < W; ++k) planes[k * n + i] = static_cast<std::byte>(v >> (8 * k));
  }
}

// t[i] = (b ? b[i] : 0) ^ element i gathered from the planes.
template <typename T>
void JoinPlanes(const std::byte* planes, const std::byte* b, std::byte* t, size_t n) {
  constexpr size_t W = sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T v = 0;
    for (size_t k = 0; k < W; ++k) v = static_cast<T>(v | static_cast<T>(static_cast<T>(planes[k * n + i]) << (8 * k)));
    if (b != nullptr) {
      T y;
      std::memcpy(&y, b + i * W, W);
      v = static_cast<T>(v ^ y);
    }
    std::memcpy(t + i * W, &v, W);
  }
}

// dst[i] = a[i] ^ b[i] over n bytes.
inline void XorBytes(const std::byte* a, const std::byte* b, std::byte* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] ^ b[i];
}

inline bool AllZero(const std::byte* p, size_t n) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    acc |= v;
  }
  for (; i < n; ++i) acc |= static_cast<uint64_t>(p[i]);
  return acc == 0;
}

}  // namespace viper::delta_internal
