#include "autotuner.h"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace viper::data_internal {

AutoTuner::AutoTuner(TunerSetting start, TunerLimits limits)
    : setting_(start), limits_(limits), ceiling_(limits.max_readers) {}

size_t AutoTuner::BufferCap() const {
  size_t cap = limits_.max_buffer_samples;
  if (mean_sample_bytes_ > 0) {
    double fit = static_cast<double>(limits_.max_buffer_bytes) / mean_sample_bytes_;
    if (fit < static_cast<double>(cap)) cap = static_cast<size_t>(fit);
  }
  return std::max<size_t>(cap, 1);
}

// Every reader needs a slot to read into, plus as many again as slack for the consumer.
size_t AutoTuner::BufferFor(size_t readers) const { return std::min(BufferCap(), 2 * readers); }

TunerSetting AutoTuner::Step(const TunerWindow& w, std::string* reason) {
  reason->clear();
  if (w.seconds <= 0) return setting_;
  if (w.completed > 0) {
    double m = static_cast<double>(w.completed_bytes) / static_cast<double>(w.completed);
    mean_sample_bytes_ = mean_sample_bytes_ == 0 ? m : 0.7 * mean_sample_bytes_ + 0.3 * m;
  }
  if (bound_age_ > 0 && --bound_age_ == 0) {
    ceiling_ = limits_.max_readers;
    floor_ = 1;
  }
  double wait = w.consumer_wait_seconds / w.seconds;
  double rate = static_cast<double>(w.completed) / w.seconds;
  double blocked = w.reader_blocked_seconds / (static_cast<double>(setting_.readers) * w.seconds);

  std::optional<TunerSetting> next;
  if (probe_) {
    Probe p = *probe_;
    probe_.reset();
    next = JudgeProbe(p, rate, wait, reason);
  }
  if (!next && wait > kStarved) next = OnStarved(rate, wait, blocked, reason);
  if (!next && wait <= kStarved) {
    if (wait < kIdle) {
      next = OnIdle(w, rate, wait, blocked, reason);
    } else {
      idle_windows_ = 0;
      idle_min_ready_ = SIZE_MAX;
    }
  }
  if (next) setting_ = *next;
  // The byte cap may have tightened as the mean sample size became known.
  if (setting_.buffer_samples > BufferCap()) setting_.buffer_samples = BufferCap();
  return setting_;
}

// The window after a change of readers: keep it if it paid, else go back and remember the bound.
std::optional<TunerSetting> AutoTuner::JudgeProbe(const Probe& p, double rate, double wait, std::string* reason) {
  if (p.up) {
    bool paid = rate > p.rate * kGain || wait < 0.5 * p.wait;
    if (paid) {
      step_ = std::min(step_ * 2, kMaxStep);
      return std::nullopt;  // keep it, and let the rules below climb further if still starved
    }
    ceiling_ = p.before.readers;
    bound_age_ = kCooldown;
    step_ = 1;
    *reason = fmt::format("{} readers did not pay ({:.0f} -> {:.0f} samples/s, wait {:.1f}% -> {:.1f}%): back to {}",
                          setting_.readers, p.rate, rate, 100 * p.wait, 100 * wait, p.before.readers);
    return TunerSetting{p.before.readers, setting_.buffer_samples};
  }
  if (wait > kStarved) {
    floor_ = p.before.readers;
    bound_age_ = kCooldown;
    TunerSetting back{p.before.readers, std::max(setting_.buffer_samples, p.before.buffer_samples)};
    *reason = fmt::format("with {} readers and {} slots the consumer waited {:.1f}%: back to {} and {}", setting_.readers,
                          setting_.buffer_samples, 100 * wait, back.readers, back.buffer_samples);
    return back;
  }
  return std::nullopt;
}

std::optional<TunerSetting> AutoTuner::OnStarved(double rate, double wait, double blocked, std::string* reason) {
  idle_windows_ = 0;
  idle_min_ready_ = SIZE_MAX;
  TunerSetting s = setting_;
  // Readers stood blocked on a full buffer while the consumer waited: the buffer, not the readers,
  // is what runs dry (bursts, or fewer slots than readers).
  if (blocked > kBlocked && s.buffer_samples < BufferCap()) {
    s.buffer_samples = std::min(BufferCap(), std::max(s.buffer_samples * 2, s.readers + 1));
    *reason = fmt::format("consumer waited {:.1f}% while readers were blocked {:.0f}% on a full buffer: buffer {} -> {}",
                          100 * wait, 100 * blocked, setting_.buffer_samples, s.buffer_samples);
    return s;
  }
  size_t top = std::min({ceiling_, limits_.max_readers, BufferCap()});
  if (s.readers >= top) return std::nullopt;
  s.readers = std::min(top, s.readers + step_);
  s.buffer_samples = std::max(s.buffer_samples, BufferFor(s.readers));
  probe_ = Probe{setting_, rate, wait, true};
  *reason = fmt::format("consumer waited {:.1f}% at {:.0f} samples/s: readers {} -> {} (buffer {})", 100 * wait, rate,
                        setting_.readers, s.readers, s.buffer_samples);
  return s;
}

// Nothing waits: after kPatience such windows, try one reader fewer (if readers stand blocked on a
// full buffer) and give back half of the buffer slots that always held samples the consumer did
// not need yet. Both at once, judged as one probe: if the consumer then starves, both come back.
std::optional<TunerSetting> AutoTuner::OnIdle(const TunerWindow& w, double rate, double wait, double blocked,
                                              std::string* reason) {
  idle_min_ready_ = std::min(idle_min_ready_, w.delivered > 0 ? w.min_ready : SIZE_MAX);
  if (++idle_windows_ < kPatience) return std::nullopt;
  size_t min_ready = idle_min_ready_;
  idle_windows_ = 0;
  idle_min_ready_ = SIZE_MAX;
  TunerSetting s = setting_;
  std::vector<std::string> why;
  if (blocked > 0.5 && s.readers > floor_ && s.readers > 1) {
    s.readers -= 1;
    why.push_back(fmt::format("readers blocked {:.0f}% of the time: readers {} -> {}", 100 * blocked,
                              setting_.readers, s.readers));
  }
  size_t least = std::max<size_t>(2, s.readers);
  if (min_ready != SIZE_MAX && 2 * min_ready > s.buffer_samples && s.buffer_samples > least) {
    s.buffer_samples = std::max(least, s.buffer_samples - min_ready / 2);
    why.push_back(fmt::format("at least {} samples always ready: buffer {} -> {}", min_ready, setting_.buffer_samples,
                              s.buffer_samples));
  }
  if (why.empty()) return std::nullopt;
  probe_ = Probe{setting_, rate, wait, false};
  *reason = "consumer never waited; " + why[0] + (why.size() > 1 ? "; " + why[1] : "");
  return s;
}

}  // namespace viper::data_internal
