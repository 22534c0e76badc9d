// The host tier's segments by state, as NodeStats::host reports them (the tier itself,
// src/store/host_tier.h, is in-tree only).
#pragma once

#include <cstddef>
#include <cstdint>

namespace viper {

struct HostTierStats {
  size_t committed_segments = 0;
  size_t free_segments = 0;
  size_t writing_segments = 0;
  size_t retired_leased_segments = 0;  // retired but still leased
  uint64_t mapped_bytes = 0;
  uint64_t recycled_allocations = 0;
  uint64_t fresh_allocations = 0;
  uint64_t spare_segments = 0;  // made ahead by KeepSpare (counted in neither of the above)
};

}  // namespace viper
