// The snapshots shared by fuzz/delta_fuzz.cc (its fixed base) and fuzz/make_delta_seeds.cc (the
// seeds are deltas against that base), so that seeds decode past the header checks.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "viper/snapshot.h"

namespace viper::fuzzing {

inline std::vector<std::byte> PatternBytes(size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return out;
}

struct FuzzTensor {
  std::string name;
  DType dtype;
  int64_t elements;
  std::vector<std::byte> bytes;
};

inline std::vector<FuzzTensor> BaseTensors() {
  return {{"a.f32", DType::kF32, 1024, PatternBytes(4096, 1)},
          {"b.bf16", DType::kBF16, 3000, PatternBytes(6000, 2)},
          {"c.u8", DType::kU8, 700, PatternBytes(700, 3)},
          {"d.f64", DType::kF64, 100, PatternBytes(800, 4)}};
}

inline Snapshot BuildFuzzSnapshot(const std::vector<FuzzTensor>& tensors, uint64_t version) {
  std::vector<TensorData> data;
  for (const auto& t : tensors) data.push_back({{t.name, t.dtype, {t.elements}}, t.bytes});
  VersionStamp stamp;
  stamp.model = "fuzz";
  stamp.version = version;
  auto snap = BuildSnapshot(data, stamp, {{"k", "v"}}, 64);
  if (!snap.ok()) __builtin_trap();
  return std::move(snap).value();
}

inline const Snapshot& FuzzBase() {
  static const Snapshot base = BuildFuzzSnapshot(BaseTensors(), 1);
  return base;
}

}  // namespace viper::fuzzing
