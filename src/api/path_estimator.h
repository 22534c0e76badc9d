// PathEstimator: predicts the time of each fetch path (bytes / measured bandwidth + latency) from
// live measurements and ranks them, cheapest first. Each path keeps an exponentially weighted
// bandwidth and a fixed latency; before the first measurement it uses this machine kind's
// measured figures (docs/ARCHITECTURE.md, "Facts of the machine").
//
// One rule is not measured: on the node's host, map ranks first. It is the floor of every other
// path from that node (copy is map plus a memcpy; remote is the node reading the same segment onto
// a wire that the subscriber then lands and verifies), so a map slowed once by a loaded machine (a
// lease round trip, a cold mapping's faults) must not leave the subscriber on a costlier path, which
// would then look fast because it reads through the mapping that map left warm.
// Thread-safe.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "viper/subscriber.h"

namespace viper::internal {

struct PathChoice {
  FetchPath path;
  double predicted_s = 0;
  std::string reason;
  std::string node;  // kRemote from another node that holds the version ("host:port"); empty = ours
};

class PathEstimator {
 public:
  // Candidates in fallback order; returns them sorted by predicted time (stable for ties), map first
  // when `same_host`.
  std::vector<PathChoice> Rank(const std::vector<FetchPath>& candidates, uint64_t bytes, bool same_host,
                               bool connected) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PathChoice> out;
    for (FetchPath p : candidates) {
      const Estimate& e = EstimateFor(p);
      double t = e.latency_s + static_cast<double>(bytes) / e.bytes_per_s;
      char reason[160];
      std::snprintf(reason, sizeof reason, "%s: predicted %.3f s at %.2f GB/s (%s)", std::string(fetch_path_name(p)).c_str(),
                    t, e.bytes_per_s / 1e9, e.samples ? "measured" : "default");
      out.push_back({p, t, std::string(same_host ? "same host, " : connected ? "other host, " : "node unreachable, ") + reason, {}});
    }
    std::stable_sort(out.begin(), out.end(), [](const PathChoice& a, const PathChoice& b) {
      return a.predicted_s < b.predicted_s;
    });
    if (same_host) {
      std::stable_partition(out.begin(), out.end(), [](const PathChoice& c) { return c.path == FetchPath::kMap; });
    }
    return out;
  }

  void Record(FetchPath path, uint64_t bytes, int64_t elapsed_ns) {
    if (elapsed_ns <= 0 || bytes < (1u << 20)) return;  // too small to say anything about bandwidth
    std::lock_guard<std::mutex> lock(mu_);
    Estimate& e = EstimateFor(path);
    double bw = static_cast<double>(bytes) / (static_cast<double>(elapsed_ns) * 1e-9);
    e.bytes_per_s = e.samples == 0 ? bw : 0.7 * e.bytes_per_s + 0.3 * bw;
    e.samples++;
  }

 private:
  struct Estimate {
    double bytes_per_s;
    double latency_s;
    uint64_t samples = 0;
  };
  Estimate& EstimateFor(FetchPath p) {
    auto it = estimates_.find(p);
    if (it != estimates_.end()) return it->second;
    Estimate e{1.5e9, 1e-3};
    switch (p) {
      case FetchPath::kMap: e = {20e9, 2e-4}; break;  // map + verify: one read pass
      case FetchPath::kCopy: e = {7e9, 2e-4}; break;
      case FetchPath::kRemote: e = {4e9, 1e-3}; break;
      case FetchPath::kFile: e = {1.5e9, 5e-3}; break;
      case FetchPath::kAuto: break;
    }
    return estimates_.emplace(p, e).first->second;
  }
  std::mutex mu_;
  std::map<FetchPath, Estimate> estimates_;
};

}  // namespace viper::internal
