// RehearsalBuffer: a bounded, representative set of the samples a continual-learning job has seen,
// to be mixed into each new training batch so that the model does not forget old tasks
// (rehearsal, as in Liu et al. 2022's streaming design; docs/ARCHITECTURE.md, "Data side").
//
// Policies (which samples stay when the buffer is full):
//   kReservoir     (default) Vitter's algorithm R: after n samples were offered, each of them is in
//                  the buffer with probability capacity / n, whatever the order they came in.
//   kClassBalanced class-balanced reservoir sampling (CBRS, Chrysakis & Moens 2020): a sample of a
//                  class that is not among the largest in the buffer replaces a random sample of
//                  a largest class; a sample of a largest class replaces a random sample of its own
//                  class with probability (its class's count in the buffer) / (its class's count
//                  seen). Classes end up as equal as the stream allows; a rare class is not crowded
//                  out by a frequent one. Every sample needs a label >= 0.
//
// Spill and restore: with a spill_dir, Spill() writes the buffer and the sampler's state (samples
// seen, per class) atomically as <spill_dir>/rehearsal.vrec, a record file
// (include/viper/record_file.h) whose metadata blob is the state; Open() restores from it (every
// record's checksum verified, the state checked against the records and the options), so that a
// restarted job keeps its memory of old tasks. A capacity smaller than the spill's keeps a random
// subset (for kClassBalanced: taken from the largest classes first).
//
// Memory: capacity samples of their own bytes (copies made by Add). Samples handed out by Draw are
// shared, immutable: a sample replaced later stays valid for whoever holds it.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/status.h"

namespace viper {

enum class RehearsalPolicy : uint32_t { kReservoir = 0, kClassBalanced = 1 };
std::string_view rehearsal_policy_name(RehearsalPolicy policy);        // "reservoir" | "class_balanced"
Result<RehearsalPolicy> ParseRehearsalPolicy(std::string_view name);

struct RehearsalOptions {
  size_t capacity = 1024;       // samples kept (>= 1)
  RehearsalPolicy policy = RehearsalPolicy::kReservoir;
  uint64_t seed = 0;            // of the sampler and of Draw
  uint64_t sample_bytes = 0;    // non-zero: every sample must have exactly this many bytes
  std::filesystem::path spill_dir{};  // empty: memory only (Spill() is FailedPrecondition)
  bool restore = true;          // Open() restores from spill_dir when a spill is there
};

struct RehearsalSample {
  std::shared_ptr<const std::vector<std::byte>> bytes;
  int64_t label = -1;
};

// Everything a buffer's future depends on, to resume it exactly (State / LoadState): the same
// later Add and Draw calls then give the same results as in the buffer it came from.
struct RehearsalBufferState {
  std::vector<RehearsalSample> samples;  // in slot order (shared with the buffer, immutable)
  // Slot indices, class by class in increasing label order, each class in the sampler's order
  // (the class-balanced policy picks its victims by position in these lists).
  std::vector<uint64_t> members;
  uint64_t seen = 0;
  std::map<int64_t, uint64_t> class_seen;
  std::string rng;  // the generator's state, std::mt19937_64's text form
};

class RehearsalBuffer {
 public:
  // Validates the options; restores from the spill (see above). InvalidArgument for bad options or
  // a spill that does not match them (another policy or sample size); Corruption for a damaged
  // spill, naming the file and what is wrong (remove the file to start empty).
  static Result<std::unique_ptr<RehearsalBuffer>> Open(const RehearsalOptions& options);

  // Offers one sample of the stream; the policy decides whether it stays (true) and which sample
  // it replaces. InvalidArgument for a size other than sample_bytes, or a label < 0 under
  // kClassBalanced.
  Result<bool> Add(std::span<const std::byte> bytes, int64_t label);
  // `k` distinct samples drawn uniformly at random (all of them, shuffled, if k >= size()); with
  // `label`, from the samples of that class only (none if it holds none).
  std::vector<RehearsalSample> Draw(size_t k, std::optional<int64_t> label = std::nullopt);
  // Draws like Draw and copies them back to back into dst and their labels into `labels`;
  // returns how many. REQUIRES: options().sample_bytes != 0, dst.size() >= k * sample_bytes,
  // labels.size() >= k (else InvalidArgument).
  Result<size_t> DrawInto(size_t k, std::span<std::byte> dst, std::span<int64_t> labels,
                          std::optional<int64_t> label = std::nullopt);

  size_t size() const;
  uint64_t seen() const;                              // samples offered since the first Open
  std::map<int64_t, size_t> class_counts() const;     // label -> samples in the buffer
  std::map<int64_t, uint64_t> class_seen() const;     // label -> samples offered
  // A copy of the whole state (the samples themselves are shared, not copied).
  RehearsalBufferState State() const;
  // Replaces the whole state with `state` (from State() of a buffer with the same policy and
  // sample_bytes). InvalidArgument naming what does not fit: more samples than the capacity, a
  // sample of the wrong size, a label never seen or unlabelled under kClassBalanced, seen counts
  // that do not add up, members that are not the slots grouped by label, an unreadable rng. The
  // buffer is unchanged then.
  Status LoadState(const RehearsalBufferState& state);
  // Atomically writes the buffer to <spill_dir>/rehearsal.vrec (write, fsync, rename).
  Status Spill();
  std::filesystem::path spill_path() const;
  const RehearsalOptions& options() const { return options_; }

 private:
  struct Slot {
    std::shared_ptr<const std::vector<std::byte>> bytes;
    int64_t label = -1;
  };
  explicit RehearsalBuffer(const RehearsalOptions& options);
  Status Restore();
  // All REQUIRE mu_ held.
  void AddMember(size_t index);
  void RemoveMember(size_t index);
  void Insert(Slot slot);
  void Replace(size_t index, Slot slot);
  void RemoveAt(size_t index);
  std::optional<size_t> ChooseBalanced(int64_t label);  // REQUIRES: full
  size_t RandomBelow(size_t n);                          // REQUIRES: n > 0
  void EvictTo(size_t capacity);

  const RehearsalOptions options_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  std::vector<Slot> slots_;
  std::map<int64_t, std::vector<size_t>> members_;  // label -> indices into slots_
  std::vector<size_t> member_pos_;                  // slot -> its place in members_[label]
  std::map<int64_t, uint64_t> class_seen_;
  uint64_t seen_ = 0;
};

}  // namespace viper
