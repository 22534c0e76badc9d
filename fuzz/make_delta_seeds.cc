// Writes the seed corpus of delta_fuzz (fuzz/corpus/delta/): deltas against the fuzz target's
// fixed base (fuzz/delta_fuzz_model.h) that use every block method, plus two round-trip inputs.
// Built with the fuzz targets; run from the repository root:
//   build-fuzz/fuzz/make_delta_seeds fuzz/corpus/delta
#include <cstdio>
#include <fstream>
#include <string>

#include "delta_fuzz_model.h"
#include "viper/delta.h"

using namespace viper;
using namespace viper::fuzzing;

namespace {

void Write(const std::string& dir, const std::string& name, uint8_t mode, const std::vector<std::byte>& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(mode));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void WriteDelta(const std::string& dir, const std::string& name, const std::vector<FuzzTensor>& tensors) {
  const Snapshot& base = FuzzBase();
  Snapshot target = BuildFuzzSnapshot(tensors, 2);
  DeltaOptions options;
  options.block_bytes = 4096;
  auto delta = EncodeDelta(base, base.compute_checksum(), target, target.compute_checksum(), options);
  if (!delta.ok()) std::abort();
  Write(dir, name, 0, *delta);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_delta_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto tensors = BaseTensors();
  WriteDelta(dir, "01_unchanged", tensors);
  auto sparse = tensors;
  for (size_t i = 0; i < sparse[1].bytes.size(); i += 200) sparse[1].bytes[i] ^= std::byte{1};
  WriteDelta(dir, "02_sparse_bf16", sparse);
  auto dense = tensors;
  for (size_t i = 0; i < dense[0].bytes.size(); i += 4) dense[0].bytes[i] ^= std::byte{0x3};
  WriteDelta(dir, "03_planes_f32", dense);
  auto fresh = tensors;
  fresh[2].bytes = PatternBytes(700, 99);
  fresh.push_back({"e.i16", DType::kI16, 64, PatternBytes(128, 5)});
  WriteDelta(dir, "04_raw_and_new", fresh);
  auto reshaped = tensors;
  reshaped[3] = {"d.f64", DType::kF64, 90, PatternBytes(720, 4)};
  reshaped.erase(reshaped.begin());
  WriteDelta(dir, "05_resized_dropped", reshaped);
  // An SGD-like fp32 step: every low mantissa byte changes, byte 1 of a fifth of the elements:
  // that plane is coded as BITMAP (format version 2).
  auto stepped = tensors;
  auto noise = PatternBytes(4096, 11);
  for (size_t i = 0; i < stepped[0].bytes.size(); i += 4) {
    stepped[0].bytes[i] ^= noise[i] | std::byte{1};
    if (i % 20 == 0) stepped[0].bytes[i + 1] ^= noise[i + 1] | std::byte{1};
  }
  WriteDelta(dir, "08_bitmap_plane_f32", stepped);
  std::vector<std::byte> pair = PatternBytes(600, 7);
  pair[0] = std::byte{128};
  Write(dir, "06_roundtrip", 1, pair);
  std::vector<std::byte> same(301, std::byte{0});
  same[0] = std::byte{128};
  Write(dir, "07_roundtrip_zeros", 1, same);
  return 0;
}
