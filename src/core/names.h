// Names every layer checks the same way: model names and version numbers (the store names files
// and segments after them, the registry keys records by them) and "HOST:PORT" addresses (the
// engine listens on and connects to them, the registry records them). In core so that each layer
// validates with the same rules and messages without depending on the layer that uses the name.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "viper/status.h"

namespace viper {

// Model names are path and segment components: 1-128 chars of [A-Za-z0-9._-], not starting with '.'.
Status ValidateModelName(const std::string& model);
// Versions are 1..2^64-1; 0 is reserved ("none" / "latest" in the protocol).
Status ValidateVersion(uint64_t version);

// Parses "HOST:PORT" (IPv4 literal, name, or [IPv6]; port 0-65535). Errors name the bad part.
// Syntax only: the host is not resolved (net::IsLoopbackAddress and the engine do that).
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port);

}  // namespace viper
