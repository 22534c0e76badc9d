// The pieces every update row of `viper bench` is made of: the NT3-shaped source model in the
// producer's memory, a Publisher in this process, a consumer process (`viper bench-peer`) whose
// JSON lines say when each version went live, and the timed loop of one row. New rows (section.h)
// build on these. Not thread-safe; one run at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/child.h"
#include "harness/types.h"
#include "viper/publisher.h"
#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper::bench {

// CPU time of the calling thread, seconds.
double ThreadCpuSeconds();
// CPU-seconds every CPU of the machine has spent busy since boot (/proc/stat: all but idle and
// iowait), and the number of CPUs it counts. Namespaces share it: both "hosts" of a bench are in it.
double MachineBusyCpuSeconds();
int MachineCpus();

// Seconds between two CLOCK_REALTIME stamps in ns (comparable across processes of one host).
inline double Sec(int64_t from_ns, int64_t to_ns) { return static_cast<double>(to_ns - from_ns) / 1e9; }

// Anonymous memory, written once so that every page is faulted in before anything is timed.
class Buffer {
 public:
  static Result<Buffer> Make(size_t size, int fill);
  Buffer() = default;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// A model shaped like CANDLE NT3 (two Conv1D layers, one large dense layer, two small ones), the
// large dense layer sized so that the snapshot is about `bytes`. Tensor bytes live in `source`
// (the "training process's" memory), 64-byte aligned.
struct SourceModel {
  std::vector<TensorSpec> specs;
  std::vector<TensorData> tensors;
  Buffer source;
  uint64_t data_bytes = 0;
};
Result<SourceModel> MakeNt3(uint64_t bytes);

// How long a consumer may take for `bytes` (at least 50 MB/s, plus a minute).
std::chrono::milliseconds TransferTimeout(uint64_t bytes);

// PublishInfo of the i-th update.
PublishInfo AtStep(int i);

// A Publisher of `model` in this process, listening on config.listen, segments named after this
// process (no recovery of a previous run's); `delta`: how its node answers a consumer offering a base.
Result<std::unique_ptr<Publisher>> StartPublisher(const Config& config, const std::string& model, PublishMode mode,
                                                  DeltaMode delta = DeltaMode::kAuto);
// The options StartPublisher starts it with, for a part that sets more of them.
PublisherOptions BenchPublisherOptions(const Config& config, const std::string& model, PublishMode mode,
                                       DeltaMode delta = DeltaMode::kAuto);

// Starts `viper bench-peer <args>` (behind config.consumer_prefix: in the consumer's host) and
// waits for its {"ready":true,...} line, which it also stores in `ready_line` if given.
Result<std::unique_ptr<LineChild>> StartPeer(const Config& config, std::vector<std::string> args,
                                             nlohmann::json* ready_line = nullptr);

// Reads the peer's JSON lines until version `v` is live; returns that line. Lines of no version
// (events, e.g. a fan-out host's relay moving) go to `other` if given.
Result<nlohmann::json> WaitVersion(LineChild& peer, uint64_t v, std::chrono::milliseconds timeout,
                                   const std::function<void(const nlohmann::json&)>& other = {});

// One row: a consumer on `path` (with "--<variant>" if not empty), config.warmup untimed then
// config.reps timed publishes of `m`, each after the previous one is live.
Result<ModeResult> RunMode(const Config& config, Publisher& pub, const SourceModel& m, const std::string& path,
                           const std::string& variant);

}  // namespace viper::bench
