// The prefetcher's auto-tuner: a pure decision function over measured windows, so that it can be
// tested on synthetic measurements (tests/data/autotuner_test.cc) as well as live. Why these rules:
// docs/ARCHITECTURE.md, "Data side".
//
// Not thread-safe: the prefetcher's tuner thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace viper::data_internal {

struct TunerSetting {
  size_t readers = 1;
  size_t buffer_samples = 1;
  bool operator==(const TunerSetting&) const = default;
};

struct TunerLimits {
  size_t max_readers = 32;
  size_t max_buffer_samples = 4096;
  uint64_t max_buffer_bytes = 256ull << 20;
};

// What the prefetcher measured over one window.
struct TunerWindow {
  double seconds = 0;                 // wall time of the window (> 0)
  double consumer_wait_seconds = 0;   // time Next spent waiting for a sample
  uint64_t delivered = 0;             // samples handed to the consumer
  uint64_t completed = 0;             // reads completed (delivered later or not)
  uint64_t completed_bytes = 0;
  double reader_blocked_seconds = 0;  // summed over active readers: waiting for a free buffer slot
  size_t min_ready = 0;               // fewest samples ready when the consumer took one
};

class AutoTuner {
 public:
  // Thresholds (fractions of a window) and pacing.
  static constexpr double kStarved = 0.02;   // the consumer waited more than this: act
  static constexpr double kIdle = 0.005;     // less than this: nothing to gain, free resources
  static constexpr double kGain = 1.05;      // a probe pays if the read rate rose by 5% (or the wait halved)
  static constexpr double kBlocked = 0.10;   // readers blocked on a full buffer this much: it is too small
  static constexpr int kPatience = 5;        // idle windows in a row before giving anything back
  static constexpr int kCooldown = 25;       // windows a failed probe's bound is kept
  static constexpr size_t kMaxStep = 8;      // readers added at once, at most

  AutoTuner(TunerSetting start, TunerLimits limits);

  // One decision per window; returns the setting to use from now on. `reason` says why it
  // changed (empty when it did not).
  TunerSetting Step(const TunerWindow& window, std::string* reason);
  const TunerSetting& setting() const { return setting_; }

 private:
  struct Probe {
    TunerSetting before;
    double rate = 0, wait = 0;
    bool up = true;
  };
  std::optional<TunerSetting> JudgeProbe(const Probe& p, double rate, double wait, std::string* reason);
  std::optional<TunerSetting> OnStarved(double rate, double wait, double blocked, std::string* reason);
  std::optional<TunerSetting> OnIdle(const TunerWindow& w, double rate, double wait, double blocked, std::string* reason);
  size_t BufferCap() const;  // max_buffer_samples, or fewer when the byte cap binds
  size_t BufferFor(size_t readers) const;  // the least buffer that keeps `readers` busy

  TunerSetting setting_;
  TunerLimits limits_;
  std::optional<Probe> probe_;
  size_t step_ = 1;
  size_t ceiling_;            // readers a failed up-probe found not to pay
  size_t floor_ = 1;          // readers a failed down-probe found too few
  int bound_age_ = 0;         // windows until ceiling_/floor_ are forgotten
  int idle_windows_ = 0;
  size_t idle_min_ready_ = SIZE_MAX;
  double mean_sample_bytes_ = 0;
};

}  // namespace viper::data_internal
