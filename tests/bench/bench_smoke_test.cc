// `viper bench --quick` end to end on tiny snapshots: real producer, real consumer processes, real
// files. Checks the exit code, the printed table and that the JSON has every field, with values
// that are consistent with each other (a figure that was never measured would be 0 or missing).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "bench/bench_test_util.h"

namespace viper {
namespace {

TEST(BenchCli, QuickRunWritesEveryFigure) {
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  Outcome o = RunViper({"bench", "--quick", "--sizes", "2M,3Mi", "--poll-interval", "0.1", "--notify-count", "30",
                        "--file-dir", dir.path().string(), "--json", json_path},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("== targets"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("warm memcpy"), std::string::npos) << o.out;
  json j = json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["hosts"], 1);
  EXPECT_EQ(j["quick"], true);
  const size_t reps = j["reps"].get<size_t>(), baseline = j["baseline_reps"].get<size_t>();
  EXPECT_EQ(reps, 2u);
  EXPECT_EQ(baseline, 1u);
  ASSERT_EQ(j["sizes"].size(), 2u);
  EXPECT_EQ(j["sizes"][0]["label"], "2M");
  EXPECT_EQ(j["sizes"][1]["label"], "3Mi");
  for (const json& s : j["sizes"]) {
    SCOPED_TRACE(s["label"].get<std::string>());
    uint64_t want = s["label"] == "2M" ? 2000000 : 3u << 20;
    EXPECT_GE(s["bytes"].get<uint64_t>(), want);
    EXPECT_LE(s["bytes"].get<uint64_t>(), want + 4096);  // the dense layer is sized to fill the target
    EXPECT_EQ(s["tensors"], 10);
    ExpectSamples(s["memcpy_s"], "memcpy", reps);
    ExpectSamples(s["checksum_s"], "checksum", reps);
    ExpectSamples(s["memcpy_cpu_s"], "memcpy on CPU", reps);
    EXPECT_GT(s["memcpy_gbps"].get<double>(), 0.0);
    ASSERT_EQ(s["viper"].size(), 5u);  // 4 + the diagnostic sync map row with verify-local
    std::set<std::string> combos;
    for (const json& m : s["viper"]) {
      std::string name = m["mode"].get<std::string>() + "/" + m["path"].get<std::string>() +
                       (m["variant"] == "" ? "" : "/" + m["variant"].get<std::string>());
      combos.insert(name);
      for (const char* key : {"e2e_s", "stall_s", "stall_cpu_s", "complete_s"}) ExpectSamples(m[key], name + " " + key, reps);
      for (const char* key : {"copy_s", "notify_s", "fetch_s", "verify_s"}) ExpectSamples(m[key], name + " " + key, reps, false);
      EXPECT_GE(m["e2e_s"]["median"].get<double>(), m["complete_s"]["median"].get<double>()) << name;
      EXPECT_GE(m["fresh_segments"].get<int>(), 0);
      for (const char* key : {"e2e_over_memcpy", "stall_over_memcpy", "e2e_gbps", "fetch_gbps", "speedup_vs_file_poll"})
        EXPECT_GT(m[key].get<double>(), 0.0) << name << " " << key;
    }
    EXPECT_EQ(combos, (std::set<std::string>{"sync/map", "sync/copy", "async/map", "async/copy", "sync/map/verify-local"}));
    const json& p = s["file_poll"];
    ExpectSamples(p["e2e_s"], "file_poll e2e", baseline);
    ExpectSamples(p["stall_s"], "file_poll stall", baseline);
    ExpectSamples(p["read_s"], "file_poll read", baseline);
    ExpectSamples(p["wait_s"], "file_poll wait for the poll", baseline, false);
    EXPECT_GE(p["wait_s"]["min"].get<double>(), 0.0) << "found by a poll before the file was visible";
    EXPECT_GE(p["e2e_s"]["median"].get<double>(), p["stall_s"]["median"].get<double>());
    // The figure is the measured mean over the phases the files became visible at, one per update.
    EXPECT_DOUBLE_EQ(p["e2e_s_figure"].get<double>(), p["e2e_s"]["mean"].get<double>());
    ASSERT_EQ(p["phases"].size(), baseline);
    for (const json& phase : p["phases"]) {
      EXPECT_GE(phase.get<double>(), 0.0);
      EXPECT_LT(phase.get<double>(), 1.0);
    }
    EXPECT_DOUBLE_EQ(p["poll_interval_s"].get<double>(), 0.1);
    // write + half an interval + read: at least the half interval, at most the parts plus one interval.
    EXPECT_GE(p["expected_e2e_s"].get<double>(), 0.05);
    EXPECT_LE(p["expected_e2e_s"].get<double>(),
              p["stall_s"]["median"].get<double>() + p["read_s"]["median"].get<double>() + 0.1);
    EXPECT_FALSE(s.contains("wire"));  // only with --hosts 2
  }
  EXPECT_EQ(j["notification"]["count"], 30);
  ExpectSamples(j["notification"]["notify_s"], "notify", 30, false);
  ExpectSamples(j["notification"]["e2e_s"], "notify e2e", 30);
  ASSERT_GE(j["targets"].size(), 4u);
  for (const json& t : j["targets"]) {
    for (const char* key : {"name", "value", "threshold", "at_most", "met"}) EXPECT_TRUE(t.contains(key)) << t.dump();
    bool met = t["at_most"] ? t["value"] <= t["threshold"] : t["value"] >= t["threshold"];
    EXPECT_EQ(t["met"].get<bool>(), met) << t.dump();
  }
  // No baseline file is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 3) << "only bench.json, stdout, stderr";
}

// `viper bench --subscribers N`: every figure of the load benchmark, with its baselines.
TEST(BenchCli, SubscribersRunWritesEveryFigure) {
  testing::TempDir dir;
  auto json_path = (dir / "load.json").string();
  const size_t subscribers = 4, count = 20;
  Outcome o = RunViper({"bench", "--subscribers", std::to_string(subscribers), "--notify-count", std::to_string(count),
                        "--json", json_path},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (const char* line : {"raw fan-out", "ucx_perftest tag_lat", "4 subscribers: complete -> NOTIFY", "ratios:", "memory:"})
    EXPECT_NE(o.out.find(line), std::string::npos) << line << "\n" << o.out;
  json j = json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["subscribers"], subscribers);
  ExpectSamples(j["notify_s"], "notify", subscribers * count);
  ExpectSamples(j["last_notify_s"], "last notify", count);
  ExpectSamples(j["notify_one_s"], "notify, one subscriber", count);
  ExpectSamples(j["fanout_s"], "raw fan-out", subscribers * count);
  ExpectSamples(j["fanout_last_s"], "raw fan-out, last", count);
  EXPECT_GT(j["ucx_one_way_p50_s"].get<double>(), 0.0);
  EXPECT_GT(j["subscriber_rss_kb_median"].get<uint64_t>(), 0u);
  EXPECT_GT(j["subscriber_pss_kb_median"].get<uint64_t>(), 0u);
  EXPECT_GE(j["subscribers_pss_kb_total"].get<uint64_t>(), j["subscriber_pss_kb_median"].get<uint64_t>());
  EXPECT_GT(j["node_rss_kb"].get<uint64_t>(), 0u);
  EXPECT_GT(j["node_segment_bytes"].get<uint64_t>(), 0u);
  o = RunViper({"bench", "--subscribers", "2", "--hosts", "2"}, dir);
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.err.find("--subscribers runs on one host"), std::string::npos) << o.err;
}

TEST(BenchCli, BadArgumentsAreRefusedClearly) {
  testing::TempDir dir;
  Outcome o = RunViper({"bench", "--sizes", "12x"}, dir);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("size '12x'"), std::string::npos) << o.err;
  o = RunViper({"bench", "--sizes", "1000", "--file-dir", dir.path().string()}, dir);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("too small"), std::string::npos) << o.err;
  o = RunViper({"bench", "--hosts", "3"}, dir);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("--hosts: '3' must be an integer from 1 to 2"), std::string::npos) << o.err;
  o = RunViper({"--help"}, dir);
  EXPECT_NE(o.out.find("bench"), std::string::npos);
  EXPECT_EQ(o.out.find("bench-peer"), std::string::npos) << "the internal peer command is hidden";
}

}  // namespace
}  // namespace viper
