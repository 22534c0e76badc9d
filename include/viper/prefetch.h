// Prefetcher: reads the samples of a SampleSource (include/viper/sample_source.h) with N reader
// threads into a bounded buffer, ahead of a training loop that takes them one by one (Next) or a
// batch at a time (NextBatch), epoch after epoch, each epoch in a fresh shuffled order.
//
// An auto-tuner (docs/ARCHITECTURE.md, "Data side") watches how long the consumer waits and how
// fast the readers read, and moves N and the buffer's size online, within max_readers and
// max_buffer_bytes: it adds readers while the consumer starves and more readers read faster
// (hill climbing: a step that does not pay is taken back), grows the buffer when the consumer
// starves while readers stand blocked on a full one, and gives back readers and buffer slots that
// stay unused.
//
// Errors: a sample that cannot be read (missing, truncated, corrupt, refused by the source's
// options) fails the prefetcher with that sample's message (on_error = kFail: Next returns it,
// and every later call returns it again), or is skipped and counted (kSkip: stats().skipped,
// stats().last_skip_error).
//
// Nothing hangs: Close() (or the destructor) stops the readers wherever they are (a read in
// progress finishes first), wakes a Next blocked in another thread (it returns Cancelled) and
// joins every thread; a consumer that stops calling Next leaves the readers blocked on the full
// buffer until Close().
//
// Thread-safety: Next/NextBatch/stats/Close may be called from any thread; one consumer is the
// intended use (two consumers share the samples between them). REQUIRES: no call is in progress
// in another thread when the Prefetcher is destroyed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "viper/sample_source.h"
#include "viper/status.h"

namespace viper {

// The bytes of one sample: heap memory aligned to 64 bytes (so that numpy and torch can view it
// as any dtype without a copy). Move-only.
class SampleBuffer {
 public:
  SampleBuffer() = default;
  // Throws std::bad_alloc, as operator new does.
  static SampleBuffer Allocate(size_t size);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

struct Sample {
  uint64_t id = 0;        // in the source
  uint64_t epoch = 0;     // 0-based
  uint64_t position = 0;  // place in its epoch's (shuffled) order
  int64_t label = -1;
  SampleBuffer bytes;
};

enum class OnError { kFail, kSkip };
Result<OnError> ParseOnError(std::string_view name);  // "fail" | "skip"
std::string_view on_error_name(OnError on_error);

struct PrefetchOptions {
  uint64_t epochs = 1;           // 0: endless
  bool shuffle = true;           // a fresh permutation per epoch (seeded by seed and the epoch)
  uint64_t seed = 0;
  // Deliver in the epoch's order (deterministic; one slow read holds back the samples behind it).
  // Off: in the order reads complete (the epoch's samples all come, each once, before the next
  // epoch's first).
  bool ordered = false;
  std::vector<uint64_t> ids{};   // the samples to use (e.g. a shard); empty: all of the source
  // Data-parallel ranks (torch's DistributedSampler without padding): each epoch's order (the
  // permutation of `ids` by seed and epoch, the same on every rank) is dealt out, rank r taking
  // positions r, r + world_size, ...: every sample exactly once per epoch across the ranks, each
  // rank floor or ceil of ids / world_size of them. REQUIRES: rank < world_size <= the samples.
  uint64_t rank = 0;
  uint64_t world_size = 1;

  size_t readers = 2;            // reader threads to start with (>= 1)
  size_t buffer_samples = 16;    // samples read ahead (being read or waiting) to start with (>= 1)
  bool autotune = true;          // move readers and buffer_samples online (else they stay fixed)
  size_t max_readers = 32;       // the tuner's thread cap
  size_t max_buffer_samples = 4096;
  // Memory cap of the samples read ahead (being read or waiting for the consumer). A single sample
  // larger than the cap is still read, alone.
  uint64_t max_buffer_bytes = 256ull << 20;
  // The tuner decides once per window: at least this long and at least 16 samples delivered (or
  // four times this long).
  std::chrono::milliseconds tune_interval{200};

  OnError on_error = OnError::kFail;
};

// One decision of the tuner, for stats() and the benchmark's trace.
struct TunerEvent {
  double at_seconds = 0;       // since Start
  size_t readers = 0, buffer_samples = 0;  // the setting from then on
  double wait_fraction = 0;    // of the window that led to it
  double samples_per_second = 0;
  std::string reason;
};

struct PrefetchStats {
  uint64_t delivered = 0;           // samples handed to the consumer
  uint64_t skipped = 0;             // bad samples skipped (kSkip)
  std::string last_skip_error;
  uint64_t bytes_read = 0;
  uint64_t epoch = 0;               // the consumer's current epoch
  double consumer_wait_seconds = 0; // time Next spent waiting for a sample
  size_t readers = 0;               // current setting
  size_t buffer_samples = 0;
  size_t max_readers = 0;           // the budget now (SetLimits)
  uint64_t max_buffer_bytes = 0;
  size_t ready = 0;                 // samples waiting for the consumer now
  uint64_t buffered_bytes = 0;      // bytes of the samples read ahead now (ready + being read)
  uint64_t peak_buffered_bytes = 0;
  std::vector<TunerEvent> tuner;    // every change the tuner made, oldest first (at most 1000)
};

class Prefetcher {
 public:
  // Validates the options and starts the readers (and the tuner). InvalidArgument for a bad
  // option or an id out of range.
  static Result<std::unique_ptr<Prefetcher>> Start(std::shared_ptr<const SampleSource> source,
                                                   const PrefetchOptions& options);
  ~Prefetcher();  // Close()
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next sample of the current epoch; nullopt at the end of the epoch (the next call begins
  // the next epoch), and from then on forever after the last one (finished()). Blocks until a
  // sample is read, at most `timeout` (then Timeout). Errors: the failing sample's (kFail),
  // Cancelled after Close().
  Result<std::optional<Sample>> Next(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());
  // Up to `n` samples of the current epoch: fewer only at its end; empty at the end of the epoch
  // (as Next's nullopt). Waits for all n (or the epoch's end). A failure after some samples were
  // taken returns the failure (the samples taken are dropped).
  Result<std::vector<Sample>> NextBatch(size_t n);
  // Changes the budget at run time (a data service's per-job budget): the tuner's caps on readers
  // and on the bytes read ahead. Readers above the new cap stop after their current read; bytes
  // already read ahead beyond the cap drain as the consumer takes them (no new read is claimed
  // until they fit). InvalidArgument for max_readers outside [1, 1024] or max_buffer_bytes 0.
  Status SetLimits(size_t max_readers, uint64_t max_buffer_bytes);
  void Close();
  bool finished() const;
  PrefetchStats stats() const;
  uint64_t epoch_size() const;  // samples per epoch (before skips)

 private:
  struct Impl;
  explicit Prefetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace viper
