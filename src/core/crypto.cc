#include "crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <string>

namespace viper::crypto {

Mac HmacSha256(std::span<const std::byte> key, std::span<const std::byte> message) {
  Mac mac{};
  unsigned int length = 0;
  // One-shot HMAC cannot fail for SHA-256 with in-memory buffers short of an allocation failure,
  // which OpenSSL reports as a null return; the zero MAC then matches no honest peer's.
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), reinterpret_cast<unsigned char*>(mac.data()), &length);
  return mac;
}

Mac HmacSha256(std::string_view key, std::string_view message) {
  return HmacSha256(std::as_bytes(std::span(key.data(), key.size())),
                    std::as_bytes(std::span(message.data(), message.size())));
}

bool EqualConstantTime(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::vector<std::byte>> RandomBytes(size_t n) {
  std::vector<std::byte> out(n);
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return Status::Internal("random bytes: OpenSSL's RAND_bytes failed (error " +
                            std::to_string(ERR_get_error()) + ")");
  }
  return out;
}

std::string ToHex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    out.push_back(kDigits[std::to_integer<unsigned>(b) >> 4]);
    out.push_back(kDigits[std::to_integer<unsigned>(b) & 15]);
  }
  return out;
}

Result<std::vector<std::byte>> FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return Status::InvalidArgument("hex string of odd length " + std::to_string(hex.size()));
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("not a hex digit at offset " + std::to_string(2 * i));
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return out;
}

}  // namespace viper::crypto
