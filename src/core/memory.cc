#include "viper/memory.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of baseline x86-64
#endif

namespace viper {

void StreamingCopy(std::span<std::byte> dst, std::span<const std::byte> src) {
  std::byte* d = dst.data();
  const std::byte* s = src.data();
  size_t n = src.size();
#if defined(__x86_64__)
  // Stores must be 16-byte aligned: copy the head plainly, stream 64-byte blocks, copy the tail.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  if (head != 0) std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (size_t blocks = n / 64; blocks != 0; --blocks, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  n %= 64;
  if (n != 0) std::memcpy(d, s, n);
  _mm_sfence();  // streamed stores are weakly ordered: make them visible before anyone is told
#else
  if (n != 0) std::memcpy(d, s, n);
#endif
}

}  // namespace viper
