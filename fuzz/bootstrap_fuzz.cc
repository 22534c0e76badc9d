// libFuzzer target for the bootstrap frame (src/net/bootstrap.h), the first bytes any TCP client
// sends to a node's listener: any byte string must give a size or an error from its header, a
// frame or an error from its whole, never crash; a parsed frame must re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "net/bootstrap.h"

using namespace viper::net::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  if (size >= kBootstrapHeader) {
    auto whole = BootstrapFrameSize(bytes.first(kBootstrapHeader));
    if (whole.ok() && (*whole < kBootstrapHeader || *whole > kBootstrapHeader + kMaxToken + kMaxWorkerAddress)) std::abort();
  }
  auto frame = ParseBootstrapFrame(bytes);
  if (!frame.ok()) return 0;
  auto encoded = EncodeBootstrapFrame(frame->token, frame->worker_address);
  if (encoded.size() != size || !std::equal(encoded.begin(), encoded.end(), bytes.begin())) std::abort();
  return 0;
}
