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
#if defined(__x86_64__)
#include <tmmintrin.h>
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

// Calls fn(i) for each element i of x[0, n) ^ y[0, n) that is nonzero (elements of `width`
// bytes; y == nullptr: of x itself), in order.
template <typename Fn>
void ForEachNonzero(const std::byte* x, const std::byte* y, size_t n, size_t width, Fn&& fn) {
  const size_t bytes = n * width;
  size_t at = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (; at + 16 <= bytes; at += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + at));
    if (y != nullptr) v = _mm_xor_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(y + at)));
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
    for (size_t k = 0; k < width; ++k)
      any |= static_cast<uint64_t>(x[i * width + k] ^ (y != nullptr ? y[i * width + k] : std::byte{0}));
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

// The fused first pass of a 2- or 4-byte block with a base: planes[k * n + i] = byte k of
// t[i] ^ b[i], *plane_or[k] = the OR of plane k (0: the plane is all zero); returns how many
// elements are nonzero. One read of base and target, one write of the planes.
template <typename T>
size_t XorSplitPlanes(const std::byte* t, const std::byte* b, std::byte* planes, size_t n, uint8_t* plane_or) {
  constexpr size_t W = sizeof(T);
  static_assert(W == 2 || W == 4);
  size_t i = 0, zero = 0;
  uint8_t ors[16] = {};
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi16(0x00ff), zero_v = _mm_setzero_si128(), ones16 = _mm_set1_epi16(1);
  auto unzip = [&](__m128i a, __m128i c, __m128i* even, __m128i* odd) {
    *even = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(c, low));
    *odd = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(c, 8));
  };
  auto load = [&](size_t at) {
    return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + at)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + at)));
  };
  auto store = [&](size_t plane, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + plane * n + i), v); };
  __m128i acc = zero_v, zeros32 = zero_v;  // OR of every residual vector; zero elements per lane
  auto count = [&](__m128i v) {
    if constexpr (W == 2) {
      zeros32 = _mm_sub_epi32(zeros32, _mm_madd_epi16(_mm_cmpeq_epi16(v, zero_v), ones16));
    } else {
      zeros32 = _mm_sub_epi32(zeros32, _mm_cmpeq_epi32(v, zero_v));
    }
    acc = _mm_or_si128(acc, v);
  };
  for (; i + 16 <= n; i += 16) {
    if constexpr (W == 2) {
      __m128i x0 = load(i * 2), x1 = load(i * 2 + 16), e, o;
      count(x0);
      count(x1);
      unzip(x0, x1, &e, &o);
      store(0, e);
      store(1, o);
    } else {
      __m128i x0 = load(i * 4), x1 = load(i * 4 + 16), x2 = load(i * 4 + 32), x3 = load(i * 4 + 48);
      count(x0);
      count(x1);
      count(x2);
      count(x3);
      __m128i e01, o01, e23, o23, p0, p1, p2, p3;
      unzip(x0, x1, &e01, &o01);
      unzip(x2, x3, &e23, &o23);
      unzip(e01, e23, &p0, &p2);
      unzip(o01, o23, &p1, &p3);
      store(0, p0);
      store(1, p1);
      store(2, p2);
      store(3, p3);
    }
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ors), acc);
  uint32_t lanes[4];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), zeros32);
  zero = static_cast<size_t>(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
#endif
  for (size_t k = 0; k < W; ++k) plane_or[k] = 0;
  for (size_t j = 0; j < 16; ++j) plane_or[j % W] |= ors[j];
  for (; i < n; ++i) {
    T x, y;
    std::memcpy(&x, t + i * W, W);
    std::memcpy(&y, b + i * W, W);
    const auto v = static_cast<T>(x ^ y);
    zero += v == 0;
    for (size_t k = 0; k < W; ++k) {
      const auto byte = static_cast<uint8_t>(v >> (8 * k));
      planes[k * n + i] = static_cast<std::byte>(byte);
      plane_or[k] |= byte;
    }
  }
  return n - zero;
}

// t[i] = (b ? b[i] : 0) ^ element i gathered from the planes: byte k of element i is planes[k][i].
template <typename T>
void JoinPlanes(const std::byte* const* planes, const std::byte* b, std::byte* t, size_t n) {
  constexpr size_t W = sizeof(T);
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (W == 2 || W == 4) {
    auto plane = [&](size_t k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(planes[k] + i)); };
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
    for (size_t k = 0; k < W; ++k) v = static_cast<T>(v | static_cast<T>(static_cast<T>(planes[k][i]) << (8 * k)));
    if (b != nullptr) {
      T y;
      std::memcpy(&y, b + i * W, W);
      v = static_cast<T>(v ^ y);
    }
    std::memcpy(t + i * W, &v, W);
  }
}

// The BITMAP plane kind's two halves: a mostly-zero byte plane as a bitmap of its nonzero bytes
// (bit i % 8 of byte i / 8, LSB first) and those bytes in order. SSSE3 (pshufb with a 256-entry
// table per 8 bytes) when the CPU has it, checked once at run time; a branchless scalar loop
// otherwise. Measured on the SGD model's mantissa plane (18% nonzero): docs/ARCHITECTURE.md.
inline constexpr size_t kNonzeroSlack = 16;  // values buffers must have this many spare bytes

struct NonzeroTables {
  uint64_t compact[256];  // pshufb indices that gather the set bytes of an 8-byte group first
  uint64_t expand[256];   // pshufb indices that put the k-th value where the k-th set bit is
  uint8_t count[256];
  NonzeroTables() {
    for (unsigned m = 0; m < 256; ++m) {
      uint64_t c = ~uint64_t{0}, e = ~uint64_t{0};  // 0xff: pshufb writes 0 there
      unsigned k = 0;
      for (unsigned p = 0; p < 8; ++p) {
        if (((m >> p) & 1) == 0) continue;
        c = (c & ~(uint64_t{0xff} << (8 * k))) | (uint64_t{p} << (8 * k));
        e = (e & ~(uint64_t{0xff} << (8 * p))) | (uint64_t{k} << (8 * p));
        ++k;
      }
      compact[m] = c;
      expand[m] = e;
      count[m] = static_cast<uint8_t>(k);
    }
  }
};

inline const NonzeroTables& Tables() {
  static const NonzeroTables tables;
  return tables;
}

inline bool HaveSsse3() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("ssse3");
  return have;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// REQUIRES: values has count + kNonzeroSlack bytes of room; bitmap (n + 7) / 8.
__attribute__((target("ssse3"))) inline size_t SplitNonzeroSsse3(const std::byte* p, size_t n, std::byte* bitmap,
                                                                   std::byte* values) {
  const NonzeroTables& tab = Tables();
  const __m128i zero = _mm_setzero_si128();
  size_t k = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    if (i % 64 == 0 && i + 64 <= n) {  // 64 zero bytes (most of a very sparse plane): 8 zero bitmap bytes
      auto at = [&](size_t o) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + o)); };
      __m128i any = _mm_or_si128(_mm_or_si128(at(0), at(16)), _mm_or_si128(at(32), at(48)));
      if (_mm_movemask_epi8(_mm_cmpeq_epi8(any, zero)) == 0xffff) {
        std::memset(bitmap + i / 8, 0, 8);
        i += 48;
        continue;
      }
    }
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    auto mask = static_cast<unsigned>(~_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) & 0xffff);
    bitmap[i / 8] = static_cast<std::byte>(mask & 0xff);
    bitmap[i / 8 + 1] = static_cast<std::byte>(mask >> 8);
    __m128i lo = _mm_shuffle_epi8(v, _mm_cvtsi64_si128(static_cast<long long>(tab.compact[mask & 0xff])));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(values + k), lo);
    k += tab.count[mask & 0xff];
    __m128i hi = _mm_shuffle_epi8(_mm_srli_si128(v, 8), _mm_cvtsi64_si128(static_cast<long long>(tab.compact[mask >> 8])));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(values + k), hi);
    k += tab.count[mask >> 8];
  }
  for (; i < n; ++i) {
    if (i % 8 == 0) bitmap[i / 8] = std::byte{0};
    if (p[i] != std::byte{0}) {
      bitmap[i / 8] |= static_cast<std::byte>(1u << (i % 8));
      values[k++] = p[i];
    }
  }
  return k;
}

// REQUIRES: the bitmap has exactly `count` bits set among its first n; values has count +
// kNonzeroSlack readable bytes (each group reads 16 and consumes at most 8).
__attribute__((target("ssse3"))) inline void ExpandNonzeroSsse3(const std::byte* bitmap, const std::byte* values,
                                                                  std::byte* p, size_t n) {
  const NonzeroTables& tab = Tables();
  const __m128i zero = _mm_setzero_si128();
  size_t k = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    if (i % 64 == 0 && i + 64 <= n) {  // 64 bits clear: 64 zero bytes
      uint64_t word;
      std::memcpy(&word, bitmap + i / 8, 8);
      if (word == 0) {
        for (size_t o = 0; o < 64; o += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i + o), zero);
        i += 56;
        continue;
      }
    }
    const auto m = static_cast<uint8_t>(bitmap[i / 8]);
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + k));
    __m128i out = _mm_shuffle_epi8(v, _mm_cvtsi64_si128(static_cast<long long>(tab.expand[m])));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p + i), out);
    k += tab.count[m];
  }
  for (; i < n; ++i) {
    const bool set = (static_cast<uint8_t>(bitmap[i / 8]) >> (i % 8)) & 1;
    p[i] = set ? values[k] : std::byte{0};
    k += set;
  }
}
#endif

// Writes the bitmap ((n + 7) / 8 bytes, unused high bits of the last byte 0) and the nonzero
// bytes of p[0, n); returns how many. REQUIRES: values has room for n + kNonzeroSlack bytes.
inline size_t SplitNonzero(const std::byte* p, size_t n, std::byte* bitmap, std::byte* values) {
#if defined(__x86_64__)
  if (HaveSsse3()) return SplitNonzeroSsse3(p, n, bitmap, values);
#endif
  std::memset(bitmap, 0, (n + 7) / 8);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool set = p[i] != std::byte{0};
    bitmap[i / 8] |= static_cast<std::byte>(static_cast<unsigned>(set) << (i % 8));
    values[k] = p[i];
    k += set;
  }
  return k;
}

// p[i] = the next value if bit i is set, else 0. REQUIRES: the first n bits of the bitmap have
// exactly `count` set bits (the decoder checks it) and values has count + kNonzeroSlack readable
// bytes (the SIMD loop reads past the values it uses, never past the slack).
inline void ExpandNonzero(const std::byte* bitmap, const std::byte* values, std::byte* p, size_t n) {
#if defined(__x86_64__)
  if (HaveSsse3()) return ExpandNonzeroSsse3(bitmap, values, p, n);
#endif
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool set = (static_cast<uint8_t>(bitmap[i / 8]) >> (i % 8)) & 1;
    p[i] = set ? values[k] : std::byte{0};
    k += set;
  }
}

// Set bits among the first n bits of a bitmap.
inline size_t CountBits(const std::byte* bitmap, size_t n) {
  size_t bits = 0, i = 0;
  for (; (i + 1) * 64 <= n; ++i) {
    uint64_t w;
    std::memcpy(&w, bitmap + i * 8, 8);
    bits += static_cast<size_t>(__builtin_popcountll(w));
  }
  for (size_t b = i * 64; b < n; ++b) bits += (static_cast<uint8_t>(bitmap[b / 8]) >> (b % 8)) & 1;
  return bits;
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
