// Keyed integrity and fresh randomness for the fleet's trust checks (token challenge-response,
// version seals). Internal to Viper: not installed, not part of the API. A thin layer over
// OpenSSL's libcrypto (vetted HMAC-SHA256, the OS's CSPRNG, constant-time compare) so that no
// primitive is written here.
// Thread-safety: every function is safe to call from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "viper/status.h"

namespace viper::crypto {

inline constexpr size_t kMacSize = 32;  // HMAC-SHA256
using Mac = std::array<std::byte, kMacSize>;

// HMAC-SHA256 of `message` under `key` (any length; an empty key is allowed by HMAC but callers
// with no secret should not call this).
Mac HmacSha256(std::span<const std::byte> key, std::span<const std::byte> message);
Mac HmacSha256(std::string_view key, std::string_view message);

// True when a and b have the same length and bytes; the time taken does not depend on where
// they differ.
bool EqualConstantTime(std::span<const std::byte> a, std::span<const std::byte> b);

// `n` bytes from the operating system's CSPRNG (nonces, unpredictable names).
Result<std::vector<std::byte>> RandomBytes(size_t n);

// Lower-case hex of `bytes`, and back (nullopt-like error on odd length or a non-hex digit).
std::string ToHex(std::span<const std::byte> bytes);
Result<std::vector<std::byte>> FromHex(std::string_view hex);

}  // namespace viper::crypto
