// The model of the delta tests (tests/api/delta_node_test.cc and its consumer process
// delta_peer.cc): version v of a model with a tensor of every dtype, NaN payloads and signed
// zeros, about 1% of the elements changed per version, and a tensor set, shapes and metadata that
// change along the way. Both processes compute it from the version number alone.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "viper/snapshot.h"

namespace viper::testing {

struct ModelTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// The last version <= v that changed element i of tensor `salt` (0 = never changed).
inline uint64_t LastTouch(uint64_t salt, uint64_t i, uint64_t v) {
  for (uint64_t u = v; u >= 2; --u)
    if (Mix(salt * 1000003 + i * 131 + u) % 100 == 0) return u;
  return 0;
}

// Bit patterns a value-based codec would lose: NaNs with payloads, signaling NaNs, infinities,
// signed zeros, denormals.
inline constexpr uint32_t kSpecialF32[] = {0x7fc00000, 0x7fc00001, 0xffc12345, 0x7f800001, 0xff800001, 0x7f800000,
                                           0xff800000, 0x00000000, 0x80000000, 0x00000001, 0x80000001};

inline ModelTensor MakeTensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint64_t salt,
                              uint64_t v) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const size_t w = dtype_size(dtype);
  ModelTensor t{name, dtype, std::move(shape), std::vector<std::byte>(static_cast<size_t>(elements) * w)};
  for (int64_t i = 0; i < elements; ++i) {
    uint64_t value = Mix(salt * 7919 + static_cast<uint64_t>(i) * 31 + LastTouch(salt, static_cast<uint64_t>(i), v));
    if (dtype == DType::kBool) value &= 1;
    if (name == "specials") value = kSpecialF32[value % std::size(kSpecialF32)];
    std::memcpy(t.bytes.data() + static_cast<size_t>(i) * w, &value, w);
  }
  return t;
}

// Version v (>= 1). Tensor set: "extra" exists in versions 3 and 4; "reshaped" is [4096] until 3,
// then [64, 64] (same bytes); "resized" grows at version 4; the metadata changes every version.
inline std::vector<ModelTensor> DeltaModel(uint64_t v) {
  std::vector<ModelTensor> out;
  uint64_t salt = 1;
  for (DType dtype : kAllDTypes) {
    int64_t elements = dtype == DType::kBF16 ? 131072 : 20000 + static_cast<int64_t>(salt) * 17;
    out.push_back(MakeTensor("t." + std::string(dtype_name(dtype)), dtype, {elements}, salt++, v));
  }
  out.push_back(MakeTensor("specials", DType::kF32, {5000}, 100, v));
  out.push_back(MakeTensor("reshaped", DType::kF16, v <= 3 ? std::vector<int64_t>{4096} : std::vector<int64_t>{64, 64}, 101, v));
  out.push_back(MakeTensor("resized", DType::kI32, {v < 4 ? 3000 : 3100}, 102, v));
  if (v == 3 || v == 4) out.push_back(MakeTensor("extra", DType::kU8, {7777}, 103, v));
  return out;
}

inline std::map<std::string, std::string> DeltaModelMetadata(uint64_t v) {
  return {{"epoch", std::to_string(v / 2)}, {"note", v % 2 ? "odd" : "even"}};
}

// "" if `s` holds exactly version v's tensors (names, dtypes, shapes, bytes) and user metadata.
inline std::string CompareWithDeltaModel(const Snapshot& s, uint64_t v) {
  auto want = DeltaModel(v);
  if (s.tensors().size() != want.size())
    return std::to_string(s.tensors().size()) + " tensors, expected " + std::to_string(want.size());
  for (const auto& t : want) {
    const TensorInfo* got = s.find(t.name);
    if (got == nullptr) return "tensor " + t.name + " missing";
    if (got->dtype != t.dtype || got->shape != t.shape) return "tensor " + t.name + " has another dtype or shape";
    auto bytes = s.tensor_data(*got);
    if (bytes.size() != t.bytes.size() || std::memcmp(bytes.data(), t.bytes.data(), bytes.size()) != 0)
      return "tensor " + t.name + " differs";
  }
  for (const auto& [k, val] : DeltaModelMetadata(v))
    if (s.meta(k) != val) return "metadata " + k + " differs";
  return "";
}

}  // namespace viper::testing
