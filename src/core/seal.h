// Version seals: with a fleet secret (the node's token) every version carries, in its
// VersionInfo metadata under "viper.seal", an HMAC-SHA256 over its identity (model, version,
// size, checksum) made by the node that published it, under a key derived from the token.
// Consumers, relays and registry-driven pulls with the token check it before a version goes
// live or is forwarded (docs/PROTOCOL.md, "Version seals"). Internal to Viper: not installed.
// Thread-safety: every function is safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "net/protocol.h"
#include "viper/status.h"

namespace viper::internal {

inline constexpr std::string_view kMetaSeal = "viper.seal";

// The seal (64 lower-case hex digits) of a version's identity under the key derived from `token`.
// REQUIRES: token is not empty.
std::string SealOf(std::string_view token, std::string_view model, uint64_t version, uint64_t size, uint64_t checksum);

// Sets info->metadata["viper.seal"] from `token`; does nothing without a token.
void SealVersion(std::string_view token, proto::VersionInfo* info);

// OK without a token (nothing to check) or when the seal verifies (constant-time compare);
// PermissionDenied otherwise, naming the model, version and `holder` ("node 10.0.0.5:7300").
Status CheckSeal(std::string_view token, const proto::VersionInfo& info, std::string_view holder);

}  // namespace viper::internal
