// Latency histograms: bucketing, their encoding among STATS_REPLY's counters and back (untrusted
// names ignored, not trusted), and the Prometheus text of a node's counters.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <thread>

#include "viper/metrics.h"

namespace viper {
namespace {

TEST(LatencyRecorder, BucketsByUpperBoundInclusive) {
  LatencyRecorder r;
  r.Record(-5);            // clock step: 0
  r.Record(100'000);       // 100 us: the first bucket (le 0.0001)
  r.Record(100'001'000);   // 100.001 ms: le 0.25
  r.Record(2'000'000'000); // 2 s: le 2.5
  r.Record(int64_t{500} * 1'000'000'000);  // 500 s: above the last bound
  LatencyHistogram h = r.Snapshot();
  EXPECT_EQ(h.count(), 5u);
  EXPECT_EQ(h.counts[0], 2u);
  EXPECT_EQ(h.counts[10], 1u);  // 250000 us
  EXPECT_EQ(h.counts[13], 1u);  // 2500000 us
  EXPECT_EQ(h.counts[kLatencyBuckets - 1], 1u);
  EXPECT_EQ(h.sum_us, 100u + 100001u + 2000000u + 500000000u);
}

TEST(LatencyRecorder, ConcurrentRecordsAllCounted) {
  LatencyRecorder r;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 10000; ++i) r.Record(int64_t{1000} * (i % 7 + t));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.Snapshot().count(), 40000u);
}

TEST(HistogramCounters, RoundTripAndMalformedNamesIgnored) {
  LatencyRecorder r;
  for (int i = 0; i < 10; ++i) r.Record(int64_t{3} * 1'000'000);  // 3 ms
  std::map<std::string, uint64_t> counters = {{"peers", 2}};
  AddHistogramCounters(counters, "publish_live", r.Snapshot());
  EXPECT_EQ(counters.size(), 1 + kLatencyBuckets + 1);
  EXPECT_EQ(counters.at("hist_publish_live_us_le_5000"), 10u);
  EXPECT_EQ(counters.at("hist_publish_live_us_sum"), 30000u);
  // What another process might send: none of these may crash or make a histogram.
  counters["hist_"] = 1;
  counters["hist__us_le_5"] = 1;
  counters["hist_x_us_le_"] = 1;
  counters["hist_x_us_le_-1"] = 1;
  counters["hist_x_us_le_05"] = 1;
  counters["hist_x_us_le_99999999999999999999999"] = 1;
  counters["hist_x_us_le_1e3"] = 1;
  counters["hist_X_us_le_5"] = 1;
  counters["hist_x y_us_sum"] = 1;
  counters["hist_x\n_us_le_inf"] = 1;
  auto hs = HistogramsFromCounters(counters);
  ASSERT_EQ(hs.size(), 1u);
  EXPECT_EQ(hs[0].name, "publish_live");
  EXPECT_EQ(hs[0].count(), 10u);
  ASSERT_EQ(hs[0].buckets.size(), kLatencyBuckets);
  for (size_t i = 0; i < kLatencyBoundsUs.size(); ++i) EXPECT_EQ(hs[0].buckets[i].first, kLatencyBoundsUs[i]);  // numeric order
  EXPECT_EQ(hs[0].buckets.back().first, std::numeric_limits<uint64_t>::max());
}

TEST(PrometheusText, CountersGaugesHistogramsAndUnknownNames) {
  LatencyRecorder r;
  r.Record(int64_t{3} * 1'000'000);
  r.Record(int64_t{200} * 1'000'000'000);
  std::map<std::string, uint64_t> counters = {
      {"versions_committed", 3}, {"peers", 2}, {"from_a_newer_node", 7}, {"Bad-Name", 1}, {"bad\nname", 1}};
  AddHistogramCounters(counters, "fetch_send", r.Snapshot());
  const std::string text = PrometheusText(counters);
  EXPECT_NE(text.find("# TYPE viper_versions_committed_total counter\nviper_versions_committed_total 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE viper_peers gauge\nviper_peers 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE viper_from_a_newer_node untyped\nviper_from_a_newer_node 7\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("Bad"), std::string::npos) << text;
  EXPECT_EQ(text.find("bad"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE viper_fetch_send_seconds histogram\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_bucket{le=\"0.0025\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_bucket{le=\"0.005\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_bucket{le=\"100\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_sum 200.003\n"), std::string::npos) << text;
  EXPECT_NE(text.find("viper_fetch_send_seconds_count 2\n"), std::string::npos) << text;
  // No line but HELP, TYPE and samples; every line ends.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_FALSE(line.empty());
  EXPECT_TRUE(text.ends_with("\n"));
}

}  // namespace
}  // namespace viper
