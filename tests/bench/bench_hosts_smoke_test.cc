// `viper bench --hosts 2 --quick` end to end: two real network namespaces (scripts/hosts.sh), the
// producer in h1, consumers, poller and wire baselines in h2. Needs root: without it the test fails
// with that reason (it is labelled netns so that unprivileged runs can exclude it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>

#include "bench/bench_test_util.h"

namespace viper {
namespace {

TEST(BenchHosts, QuickRunAcrossNamespacesWritesEveryFigure) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root (network namespaces); exclude with ctest -LE netns";
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  Outcome o = RunViper({"bench", "--hosts", "2", "--quick", "--sizes", "2M", "--poll-interval", "0.1", "--notify-count",
                        "30", "--file-dir", dir.path().string(), "--json", json_path,
                        "--hosts-script", std::string(VIPER_SOURCE_DIR) + "/scripts/hosts.sh"},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("consumer in namespace h2"), std::string::npos) << o.out;
  json j = json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["hosts"], 2);
  ASSERT_EQ(j["sizes"].size(), 1u);
  const json& s = j["sizes"][0];
  std::set<std::string> combos;
  for (const json& m : s["viper"]) {
    std::string name = m["mode"].get<std::string>() + "/" + m["path"].get<std::string>() +
                       (m["variant"] == "" ? "" : "/" + m["variant"].get<std::string>());
    combos.insert(name);
    ExpectSamples(m["e2e_s"], name + " e2e", 2);
    ExpectSamples(m["fetch_s"], name + " fetch", 2);
    for (const char* key : {"e2e_over_tcp_stream", "fetch_over_tcp_stream", "fetch_over_ucx_tag_bw"})
      EXPECT_GT(m[key].get<double>(), 0.0) << name << " " << key;
  }
  // Each mode also runs with the producer's cut-through off (the same publish + transfer in
  // sequence), and sync a draft committed (Begin/Commit) with and without it.
  EXPECT_EQ(combos, (std::set<std::string>{"sync/remote", "async/remote", "sync/remote/no-verify",
                                           "sync/remote/no-cut-through", "async/remote/no-cut-through",
                                           "sync/remote/draft", "sync/remote/draft-no-cut-through"}));
  const json& w = s["wire"];
  EXPECT_EQ(w["error"], "") << w.dump();
  EXPECT_EQ(w["tcp_cc"], "cubic");
  EXPECT_EQ(w["tcp_all_gbps"].size(), 6u);  // 3 streams before and 3 after the rows
  EXPECT_EQ(w["ucx_all_gbps"].size(), 2u);
  EXPECT_GT(w["tcp_gbps"].get<double>(), 0.0);
  EXPECT_GT(w["ucx_tag_bw_gbps"].get<double>(), 0.0);
  EXPECT_GT(w["landed_gbps"].get<double>(), 0.0);
  EXPECT_EQ(w["ucx_peer_failure_all_gbps"].size(), 2u);
  EXPECT_GT(w["ucx_tag_bw_peer_failure_gbps"].get<double>(), 0.0);
  EXPECT_GT(w["verified_gbps"].get<double>(), 0.0);
  ExpectSamples(s["file_poll"]["e2e_s"], "file_poll e2e", 1);
  ExpectSamples(j["notification"]["notify_s"], "notify", 30, false);
  // The namespaces are gone afterwards.
  EXPECT_EQ(o.out.find("hosts.sh: down"), std::string::npos) << "progress lines go to stderr";
  EXPECT_NE(o.err.find("down: prefix"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace viper
