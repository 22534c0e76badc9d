// Byte counts and durations as people read them ("1.7 GB", "158.2 ms"). Thread-safe (pure).
#pragma once

#include <string>

namespace viper {

// Decimal units, one decimal: "512.0 B", "64.0 MB", "1.7 GB".
std::string HumanBytes(double bytes);

// "850 us", "158.2 ms", "2.31 s".
std::string HumanSeconds(double seconds);

}  // namespace viper
