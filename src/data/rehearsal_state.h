// The rehearsal buffer's state as stored in its spill file's metadata blob (src/data only; the
// decoder is fuzzed by fuzz/record_fuzz.cc, since a spill file is untrusted input).
//
// Layout (little-endian): "VRHS", u32 version (1), u32 policy, u32 zero, u64 capacity, u64 seen,
// u64 sample_bytes, u64 class count C, then C pairs (i64 label, u64 seen) with labels increasing.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "viper/record_file.h"
#include "viper/status.h"

namespace viper::data_internal {

struct RehearsalState {
  uint32_t policy = 0;
  uint64_t capacity = 0, seen = 0, sample_bytes = 0;
  std::vector<std::pair<int64_t, uint64_t>> class_seen;  // label -> samples offered, by label
};

std::vector<std::byte> EncodeRehearsalState(const RehearsalState& state);
// Every field checked: Corruption naming the fault.
Result<RehearsalState> DecodeRehearsalState(std::span<const std::byte> bytes);
// The state agrees with the records of the file it came with (counts, sizes, labels).
Status CheckRehearsalState(const RehearsalState& state, const RecordFile& file);

}  // namespace viper::data_internal
