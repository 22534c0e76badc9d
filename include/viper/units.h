// Byte counts and durations as people read and write them ("1.7 GB", "64Mi", "158.2 ms").
// Thread-safe (pure).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "viper/status.h"

namespace viper {

// Decimal units, one decimal: "512.0 B", "64.0 MB", "1.7 GB".
std::string HumanBytes(double bytes);

// "850 us", "158.2 ms", "2.31 s".
std::string HumanSeconds(double seconds);

// A byte count from untrusted text (a command-line value): a non-negative number with an optional
// suffix, decimal k/K M G T (x1000) or binary Ki Mi Gi Ti (x1024), each optionally followed by B
// ("600M", "600MB", "1.7G", "64Mi", "64MiB", "4096", "4096B"); rounded to whole bytes, at most
// 2^53 (a double's exact integers: no silent wrap). A positive value below one byte ("0.4") is
// refused, not rounded to 0 (which callers read as "none" or "the default"). InvalidArgument names
// `what` and the text: "size '12x': unknown suffix 'x' (...)".
Result<uint64_t> ParseBytes(std::string_view text, std::string_view what = "byte count");

}  // namespace viper
