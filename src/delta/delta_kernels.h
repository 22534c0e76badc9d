// The delta codec's inner loops, one instantiation per element width (T = uint8_t .. uint64_t).
// Plain loops over memcpy'd elements where the compiler vectorizes them (this directory builds
// with -O3); SSE2 (baseline x86-64) byte transposes for the planes of 2- and 4-byte elements,
// which it does not. Speeds on 1 MiB blocks: docs/ARCHITECTURE.md "Delta updates".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace viper::delta_internal {

// r[i] = t[i] ^ b[i] over n elements; returns how many are nonzero. The count is kept in a 32-bit
// accumulator per 4096 elements: with a size_t one GCC does not vectorize the 16-bit loop (5x slower).
template <typename T>
size_t XorCount(const std::byte* t, const std::byte* b, std::byte* r, size_t n) {
  size_t nonzero = 0;
  for (size_t i = 0; i < n;) {
    const size_t end = std::min(n, i + 4096);
    uint32_t c = 0;
    for (; i < end; ++i) {
      T x, y;
      std::memcpy(&x, t + i * sizeof(T), sizeof(T));
      std::memcpy(&y, b + i * sizeof(T), sizeof(T));
      T v = static_cast<T>(x ^ y);
      std::memcpy(r + i * sizeof(T), &v, sizeof(T));
      c += v != 0;
    }
    nonzero += c;
  }
  return nonzero;
}

template <typename T>
size_t CountNonzero(const std::byte* r, size_t n) {
  size_t nonzero = 0;
  for (size_t i = 0; i < n;) {
    const size_t end = std::min(n, i + 4096);
    uint32_t c = 0;
    for (; i < end; ++i) {
      T v;
      std::memcpy(&v, r + i * sizeof(T), sizeof(T));
      c += v != 0;
    }
    nonzero += c;
  }
  return nonzero;
}

// Calls fn(i) for each nonzero element i of r[0, n) (elements of `width` bytes), in order.
template <typename Fn>
void ForEachNonzero(const std::byte* r, size_t n, size_t width, Fn&& fn) {
  const size_t bytes = n * width;
  size_t at = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (; at + 16 <= bytes; at += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + at));
    auto mask = static_cast<uint32_t>(~_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) & 0xffff);  // nonzero bytes
    while (mask != 0) {
      const size_t byte = static_cast<size_t>(__builtin_ctz(mask));
      const size_t in_vector = byte / width;
      fn(at / width + in_vector);
      mask &= ~(((1u << width) - 1) << (in_vector * width));
    }
  }
#endif
  for (size_t i = at / width; i < n; ++i) {
    uint64_t any = 0;
    for (size_t k = 0; k < width; ++k) any |= static_cast<uint64_t>(r[i * width + k]);
    if (any != 0) fn(i);
  }
}

// planes[k * n + i] = byte k of element i.
template <typename T>
void SplitPlanes(const std::byte* r, std::byte* planes, size_t n) {
  constexpr size_t W = sizeof(T);
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (W == 2 || W == 4) {
    const __m128i low = _mm_set1_epi16(0x00ff);
    // Splits the bytes of two vectors into the even ones and the odd ones (in order).
    auto unzip = [&](__m128i a, __m128i b, __m128i* even, __m128i* odd) {
      *even = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
      *odd = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
    };
    auto load = [&](size_t at) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + at)); };
    auto store = [&](size_t plane, __m128i v) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + plane * n + i), v);
    };
    for (; i + 16 <= n; i += 16) {
      if constexpr (W == 2) {
        __m128i e, o;
        unzip(load(i * 2), load(i * 2 + 16), &e, &o);
        store(0, e);
        store(1, o);
      } else {
        __m128i e01, o01, e23, o23, p0, p1, p2, p3;
        unzip(load(i * 4), load(i * 4 + 16), &e01, &o01);
        unzip(load(i * 4 + 32), load(i * 4 + 48), &e23, &o23);
        unzip(e01, e23, &p0, &p2);
        unzip(o01, o23, &p1, &p3);
        store(0, p0);
        store(1, p1);
        store(2, p2);
        store(3, p3);
      }
    }
  }
#endif
  for (; i < n; ++i) {
    T v;
    std::memcpy(&v, r + i * W, W);
    for (size_t k = 0; k < W; ++k) planes[k * n + i] = static_cast<std::byte>(v >> (8 * k));
  }
}

// t[i] = (b ? b[i] : 0) ^ element i gathered from the planes.
template <typename T>
void JoinPlanes(const std::byte* planes, const std::byte* b, std::byte* t, size_t n) {
  constexpr size_t W = sizeof(T);
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (W == 2 || W == 4) {
    auto plane = [&](size_t k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(planes + k * n + i)); };
    auto put = [&](size_t at, __m128i v) {
      if (b != nullptr) v = _mm_xor_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + at)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(t + at), v);
    };
    for (; i + 16 <= n; i += 16) {
      if constexpr (W == 2) {
        __m128i p0 = plane(0), p1 = plane(1);
        put(i * 2, _mm_unpacklo_epi8(p0, p1));
        put(i * 2 + 16, _mm_unpackhi_epi8(p0, p1));
      } else {
        __m128i p0 = plane(0), p1 = plane(1), p2 = plane(2), p3 = plane(3);
        __m128i lo01 = _mm_unpacklo_epi8(p0, p1), hi01 = _mm_unpackhi_epi8(p0, p1);
        __m128i lo23 = _mm_unpacklo_epi8(p2, p3), hi23 = _mm_unpackhi_epi8(p2, p3);
        put(i * 4, _mm_unpacklo_epi16(lo01, lo23));
        put(i * 4 + 16, _mm_unpackhi_epi16(lo01, lo23));
        put(i * 4 + 32, _mm_unpacklo_epi16(hi01, hi23));
        put(i * 4 + 48, _mm_unpackhi_epi16(hi01, hi23));
      }
    }
  }
#endif
  for (; i < n; ++i) {
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
