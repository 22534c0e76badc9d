// libFuzzer target for the delta codec. The first input byte picks the mode:
//  - even: the rest is a delta stream, decoded against a fixed base (fuzz/delta_fuzz_model.h) into
//    a target of the size its header declares (up to 1 MiB). It must decode or fail with
//    Corruption, never read or write outside the buffers; a complete decode wrote exactly the
//    declared target.
//  - odd: the rest is split into two byte strings that become the tensors of a base and a target
//    snapshot (dtypes, names and sizes drawn from the bytes); encode + decode must give back the
//    target bit for bit (this fuzzes the encoder's choices: gaps, planes, zstd, block edges).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "delta_fuzz_model.h"
#include "viper/delta.h"

namespace {

#define FUZZ_CHECK(cond)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "delta_fuzz: invariant failed: %s\n", #cond); \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

void DecodeMode(std::span<const std::byte> stream) {
  const viper::Snapshot& base = viper::fuzzing::FuzzBase();
  auto header = viper::ParseDeltaHeader(stream);
  uint64_t target_size = header.ok() ? header->target_size : 64;
  uint64_t base_checksum = header.ok() ? header->base_checksum : 0;
  if (target_size > (1u << 20)) target_size = 1u << 20;
  std::vector<std::byte> target(target_size);
  viper::DeltaDecoder decoder(base.bytes(), base_checksum, target);
  viper::Status st = decoder.Feed(stream);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == viper::StatusCode::kCorruption && !st.message().empty());
    FUZZ_CHECK(!decoder.Feed(stream).ok());  // a failed decoder stays failed
    return;
  }
  FUZZ_CHECK(decoder.decoded_bytes() <= target.size());
  if (decoder.complete()) FUZZ_CHECK(decoder.decoded_bytes() == target.size());
}

viper::DType PickDtype(uint8_t b) { return viper::kAllDTypes[b % std::size(viper::kAllDTypes)]; }

// Tensors made from `bytes`: each takes a control byte (dtype, name), a length byte, then data.
std::vector<viper::fuzzing::FuzzTensor> TensorsFrom(std::span<const std::byte> bytes) {
  std::vector<viper::fuzzing::FuzzTensor> out;
  size_t pos = 0;
  while (pos + 2 <= bytes.size() && out.size() < 6) {
    auto control = static_cast<uint8_t>(bytes[pos]);
    auto length = static_cast<uint8_t>(bytes[pos + 1]);
    pos += 2;
    viper::DType dtype = PickDtype(control);
    size_t w = viper::dtype_size(dtype);
    size_t elements = std::min<size_t>((length + 1) * 37u, (bytes.size() - pos) / w);
    std::vector<std::byte> data(bytes.begin() + pos, bytes.begin() + pos + elements * w);
    pos += elements * w;
    std::string name = "t" + std::to_string((control >> 4) % 5);
    bool duplicate = false;
    for (const auto& t : out) duplicate |= t.name == name;
    if (!duplicate) out.push_back({name, dtype, static_cast<int64_t>(elements), std::move(data)});
  }
  return out;
}

void RoundTripMode(std::span<const std::byte> rest) {
  size_t half = rest.empty() ? 0 : static_cast<uint8_t>(rest[0]) * rest.size() / 256;
  if (!rest.empty()) rest = rest.subspan(1), half = std::min(half, rest.size());
  auto base = viper::fuzzing::BuildFuzzSnapshot(TensorsFrom(rest.first(half)), 1);
  auto target = viper::fuzzing::BuildFuzzSnapshot(TensorsFrom(rest.subspan(half)), 2);
  viper::DeltaOptions options;
  options.block_bytes = 4096;  // many blocks, many edges
  auto delta = viper::EncodeDelta(base, base.compute_checksum(), target, target.compute_checksum(), options);
  FUZZ_CHECK(delta.ok());
  std::vector<std::byte> out(target.bytes().size());
  FUZZ_CHECK(viper::DecodeDelta(base.bytes(), base.compute_checksum(), *delta, out).ok());
  FUZZ_CHECK(std::memcmp(out.data(), target.bytes().data(), out.size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    DecodeMode(rest);
  } else {
    RoundTripMode(rest);
  }
  return 0;
}
