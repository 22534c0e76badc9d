// When a node sends a consumer a delta instead of the full snapshot (DeltaMode, NodeOptions::delta),
// what it prepared for a version (PreparedDelta, PublishResult::delta) and its counters
// (DeltaStats, NodeStats::delta). The codec itself is include/viper/delta.h; the design and the
// measurements are docs/ARCHITECTURE.md "Delta updates".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "viper/status.h"

namespace viper {

// When a node answers a FETCH that offers a base with a delta (docs/ARCHITECTURE.md "Delta updates").
enum class DeltaMode {
  kOff,     // never: always the full snapshot
  kAuto,    // when the delta is smaller and predicted to arrive sooner than the full snapshot
  kAlways,  // whenever it keeps the base, whatever the prediction (tests, benchmarks)
};
Result<DeltaMode> ParseDeltaMode(std::string_view name);  // "off" | "auto" | "always"
std::string_view delta_mode_name(DeltaMode mode);

// The delta a node encoded for a version against the version before it (eagerly, after the
// commit, while remote subscribers exist): what Publisher reports in PublishResult::delta.
struct PreparedDelta {
  bool prepared = false;        // a delta against base_version was encoded
  uint64_t base_version = 0;
  uint64_t bytes = 0;           // the delta stream's size
  uint64_t snapshot_bytes = 0;  // the version's size
  int64_t encode_ns = 0;        // wall time of the encode, first part taken to last part done
  std::string why_not;          // when not prepared: why (no remote subscriber, no previous version, ...)
};

struct DeltaStats {
  uint64_t encoded = 0;          // deltas encoded to the end
  uint64_t encoded_bytes = 0;    // their size
  uint64_t target_bytes = 0;     // the size of the versions they encode
  uint64_t cancelled = 0;        // encodes stopped (base evicted, not smaller)
  uint64_t skipped = 0;          // eager encodes not started: the model's deltas did not pay
  uint64_t sent = 0;             // delta streams sent to consumers
  uint64_t sent_bytes = 0;
  uint64_t declined = 0;         // FETCHes that offered a base and got the full snapshot
  // Relays: deltas received whole from the upstream and kept to pass on, part by part as they
  // arrived, to peers offering the same base (none of them encoded here); and their size.
  uint64_t forwarded = 0;
  uint64_t forwarded_bytes = 0;
};

}  // namespace viper
