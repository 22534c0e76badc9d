// libFuzzer target for the GPU version message parser (viper/gpu_store.h): any byte string parses
// to a message or a Corruption error, never crashes; a parsed message re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "viper/gpu_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto v = viper::gpu::ParseGpuVersion(bytes);
  if (!v.ok()) {
    if (v.status().code() != viper::StatusCode::kCorruption) std::abort();
    return 0;
  }
  std::string again = viper::gpu::EncodeGpuVersion(*v);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  return 0;
}
