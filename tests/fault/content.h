// What the fault and load tests' consumers check on every read, by themselves: a torn or
// unverified model must be caught here, whatever Viper's own checks said.
//
// The producer (fault_peer produce) fills every byte of tensor i of version v with Pattern(v, i)
// (tests/api/pattern.h), but the nonce tensor (below), so a model mixed from two versions, or with bytes not yet written, fails
// the byte scan; the xxh3 of the data region is recomputed and compared with the header's seal,
// and the header must name the model and the version the subscriber announced.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/pattern.h"
#include "viper/snapshot.h"

namespace viper::testing {

// Tensor holding a random number the producer draws at each start: a version re-published under
// an old number by a restarted producer has other bytes (and another checksum) than the original.
// With `produce --nonce version` (the churn test: no restarts) it holds the version number
// instead, so that every byte of a version follows from its number.
inline constexpr const char* kNonceTensor = "step";

// The test model: a few tensors of several dtypes, the large one of about
// `bytes` bytes (rounded to whole F32 elements, at least one).
inline std::vector<TensorSpec> FaultModelSpecs(uint64_t bytes) {
  int64_t big = static_cast<int64_t>(bytes / 4 > 0 ? bytes / 4 : 1);
  return {{"conv.weight", DType::kF32, {8, 1, 5}}, {"conv.bias", DType::kF16, {8}},
          {"dense.weight", DType::kF32, {big}}, {"dense.bias", DType::kBF16, {100}}, {"step", DType::kI64, {}}};
}

// True if every byte of `bytes` is `want`.
inline bool AllBytesAre(std::span<const std::byte> bytes, uint8_t want) {
  uint64_t word;
  std::memset(&word, want, sizeof(word));
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t got;
    std::memcpy(&got, bytes.data() + i, 8);
    if (got != word) return false;
  }
  for (; i < bytes.size(); ++i)
    if (static_cast<uint8_t>(bytes[i]) != want) return false;
  return true;
}

// "" if `snapshot` is whole version `version` of `model`, else what is wrong with it.
// `nonce_is_version`: the nonce tensor must hold `version` too (else it is not checked).
inline std::string CheckContent(const Snapshot& snapshot, const std::string& model, uint64_t version,
                                bool nonce_is_version = false) {
  if (snapshot.model() != model) return "header names model " + snapshot.model().value_or("(none)");
  if (snapshot.version() != version)
    return "header names version " + std::to_string(snapshot.version().value_or(0)) + ", announced " +
           std::to_string(version);
  auto declared = snapshot.declared_checksum();
  if (!declared) return "no checksum in the header";
  if (*declared != checksum64(snapshot.data_region())) return "data region does not match its checksum (torn)";
  const auto specs = FaultModelSpecs(1);
  if (snapshot.tensors().size() != specs.size()) return "wrong number of tensors";
  for (size_t i = 0; i < specs.size(); ++i) {  // the pattern follows the spec order, not the data order
    const TensorInfo* t = snapshot.find(specs[i].name);
    if (t == nullptr) return "tensor " + specs[i].name + " is missing";
    if (specs[i].name == kNonceTensor) {  // the producer's nonce, not a pattern
      auto bytes = snapshot.tensor_data(*t);
      if (nonce_is_version && (bytes.size() != sizeof(version) || std::memcmp(bytes.data(), &version, sizeof(version)) != 0))
        return "tensor " + specs[i].name + " does not hold the version number (torn)";
      continue;
    }
    if (!AllBytesAre(snapshot.tensor_data(*t), Pattern(version, i)))
      return "tensor " + specs[i].name + " holds bytes of another version (torn)";
  }
  return "";
}

}  // namespace viper::testing
