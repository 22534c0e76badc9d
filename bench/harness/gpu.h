// `viper bench --gpu`: GPU-resident versions on one GPU (bench/harness/gpu.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "viper/status.h"

namespace viper::bench {

struct GpuConfig {
  std::vector<uint64_t> sizes;  // model bytes
  int reps = 5;                 // timed publishes per size (after the warm-ups)
  int device = 0;
  std::string peer_bin;         // viper_gpu_peer
  std::string wire_bin;         // viper_wire_baseline: the staged path's network stage alone
};

// For each size: one device-to-device copy of the model (the physical floor, cuMemcpyDtoD timed
// with events); GPU -> pinned host -> GPU staging without Viper; publish -> live in another process
// (the version copied device-to-device by viper_gpu_peer through CUDA IPC), announced after the
// device copy and, from the same runs, after the checksum; through the node (a Subscriber process,
// gpu_early); the host path; the staged network path beside its network stage alone (a loopback TCP
// stream of the same bytes, landed and hashed: wire_bin); the training stall: a bandwidth-bound
// training step on the producer's stream with and without a publish beside it, against one device
// copy. Every figure follows one publish per buffer of the store (warm-ups). Prints a table per size and the targets; writes every figure to json_path if not empty.
// Unavailable (with the reason) without a GPU.
Status RunGpu(const GpuConfig& config, const std::string& json_path);

}  // namespace viper::bench
