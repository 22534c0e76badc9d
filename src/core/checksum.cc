// xxh3-64 checksums of snapshot data regions and their 16-hex-digit text form.
#include <xxhash.h>

#include <string>

#include "viper/snapshot.h"

namespace viper {

uint64_t checksum64(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string checksum_hex(uint64_t checksum) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(16, '0');
  for (int i = 15; i >= 0; --i, checksum >>= 4) hex[i] = kDigits[checksum & 0xf];
  return hex;
}

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<uint64_t> parse_checksum_hex(std::string_view hex) {
  // Untrusted text: quote at most a short prefix of it in the message.
  auto quoted = [&] { return "\"" + std::string(hex.substr(0, 40)) + (hex.size() > 40 ? "...\"" : "\""); };
  if (hex.size() != 16) {
    return Status::Corruption("malformed checksum " + quoted() + ": expected 16 hex digits, got " +
                              std::to_string(hex.size()) + " characters");
  }
  uint64_t value = 0;
  for (char c : hex) {
    int digit = hex_value(c);
    if (digit < 0) return Status::Corruption("malformed checksum " + quoted() + ": not a hex digit");
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace viper
