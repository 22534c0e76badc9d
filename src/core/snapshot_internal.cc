#include "snapshot_internal.h"

#include <fmt/format.h>

namespace viper::internal {

size_t FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Headers are mostly ASCII: skip 8 ASCII bytes at a time.
    uint64_t word;
    if (n - i >= 8 && (std::memcpy(&word, s + i, 8), (word & 0x8080808080808080ull) == 0)) {
      i += 8;
      continue;
    }
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return kNpos;
}

std::string Quote(std::string_view text, size_t max_bytes) {
  std::string out = "\"";
  size_t i = 0;
  for (; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80 && out.size() > max_bytes) break;  // cut only between characters
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) out += "...";
  out += '"';
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::optional<uint64_t> ElementCount(const std::vector<int64_t>& shape) {
  for (int64_t dim : shape) {
    if (dim == 0) return 0;
  }
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) return std::nullopt;
  }
  return count;
}

std::optional<uint64_t> StrideSpan(const std::vector<int64_t>& shape, size_t elem_size) {
  uint64_t span = elem_size;
  for (int64_t dim : shape) {
    if (dim != 0 && __builtin_mul_overflow(span, static_cast<uint64_t>(dim), &span)) return std::nullopt;
  }
  if (span > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return span;
}

}  // namespace viper::internal
