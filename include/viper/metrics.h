// Latency histograms a node keeps (fixed log-spaced buckets, lock-free), their encoding among the
// counters of STATS_REPLY, and the Prometheus text exposition of a node's counters.
// Design: docs/ARCHITECTURE.md "Observability".
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace viper {

// Upper bounds of the buckets in microseconds: 1-2.5-5 per decade from 100 us to 100 s (19
// bounds); a last bucket counts what is above 100 s. Fixed, so a histogram is 20 counters and a sum.
inline constexpr std::array<uint64_t, 19> kLatencyBoundsUs = {
    100,    250,    500,     1000,    2500,    5000,     10000,    25000,    50000,    100000,
    250000, 500000, 1000000, 2500000, 5000000, 10000000, 25000000, 50000000, 100000000};
inline constexpr size_t kLatencyBuckets = kLatencyBoundsUs.size() + 1;

// A histogram's counts: counts[i] observations in (bound[i-1], bound[i]] (not cumulative); the
// last entry is above the last bound.
struct LatencyHistogram {
  std::array<uint64_t, kLatencyBuckets> counts{};
  uint64_t sum_us = 0;
  uint64_t count() const;
  bool operator==(const LatencyHistogram&) const = default;
};

// Records durations from any thread without a lock (relaxed atomics: a snapshot taken during a
// Record may see the count before the sum).
class LatencyRecorder {
 public:
  void Record(int64_t duration_ns);  // negative durations (clock steps) count as 0
  LatencyHistogram Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kLatencyBuckets> counts_{};
  std::atomic<uint64_t> sum_us_{0};
};

// STATS_REPLY carries a histogram NAME as counters "hist_NAME_us_le_BOUND" (BOUND in microseconds,
// or "inf"; the bucket's own count, not cumulative) and "hist_NAME_us_sum". Old clients print or
// ignore them as counters; the frame layout is unchanged.
void AddHistogramCounters(std::map<std::string, uint64_t>& counters, std::string_view name, const LatencyHistogram& h);

struct NamedHistogram {
  std::string name;                                    // "publish_live"
  std::vector<std::pair<uint64_t, uint64_t>> buckets;  // (upper bound in us, UINT64_MAX for inf; count), by bound
  uint64_t sum_us = 0;
  uint64_t count() const;
};
// The histograms among `counters` (names as above; entries that do not parse are ignored: they
// come from another process). Sorted by name.
std::vector<NamedHistogram> HistogramsFromCounters(const std::map<std::string, uint64_t>& counters);
bool IsHistogramCounter(std::string_view name);

// The counters in the Prometheus text exposition format (version 0.0.4): "# HELP" and "# TYPE"
// lines, viper_NAME_total for counters, viper_NAME for gauges, viper_NAME_seconds_{bucket,sum,count}
// for histograms (buckets cumulative, ending with le="+Inf" == _count). Names that are not
// [a-z0-9_]+ are left out; names this build does not know are "untyped".
std::string PrometheusText(const std::map<std::string, uint64_t>& counters);

}  // namespace viper
