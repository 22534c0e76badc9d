// Private helpers shared by the host tier and the file tier.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace viper::store_internal {

// "512 B", "64.0 MiB", "1.70 GB": sizes in error messages people read.
std::string FormatBytes(uint64_t bytes);

// Parses a canonical decimal u64 ("0" or no leading zero, no sign, no overflow).
std::optional<uint64_t> ParseDecimal(std::string_view text);

// True if process `pid` exists on this host (kill(pid, 0) does not fail with ESRCH).
bool ProcessAlive(int64_t pid);

// This host's name (gethostname), "unknown-host" if it cannot be read.
std::string HostName();

}  // namespace viper::store_internal
