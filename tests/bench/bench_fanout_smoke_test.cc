// `viper bench --fanout --quick` end to end on three network namespaces (root, labelled netns):
// every row and wire figure is in the JSON, and the egress the nodes counted is what each row's
// shape implies (a structural check, never a speed).
#include <gtest/gtest.h>
#include <unistd.h>

#include "bench/bench_test_util.h"

namespace viper {
namespace {

TEST(BenchFanout, QuickRunCountsOneCopyPerRelay) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root (network namespaces); exclude with ctest -LE netns";
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  Outcome o = RunViper({"bench", "--fanout", "--quick", "--sizes", "4Mi", "--fanout-hosts", "3", "--consumers", "3",
                        "--file-dir", dir.path().string(), "--json", json_path, "--hosts-script",
                        std::string(VIPER_SOURCE_DIR) + "/scripts/hosts.sh"},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("3 consumers on 3 hosts"), std::string::npos) << o.out;
  const json f = json::parse(testing::ReadFile(json_path))["fanout"];
  EXPECT_EQ(f["hosts"], 3);
  ASSERT_EQ(f["rows"].size(), 4u);
  // name, consumers, producer egress (model sizes per update), relays' egress.
  const std::vector<std::tuple<std::string, int, double, std::vector<double>>> want = {
      {"single", 1, 1.0, {}}, {"direct", 3, 2.0, {}}, {"chain,saf", 3, 1.0, {1.0, 0.0}}, {"chain", 3, 1.0, {1.0, 0.0}}};
  for (size_t i = 0; i < want.size(); ++i) {
    const json& r = f["rows"][i];
    const auto& [name, consumers, egress, relays] = want[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(r["name"], name);
    EXPECT_EQ(r["consumers"], consumers);
    EXPECT_DOUBLE_EQ(r["producer_egress_sizes"].get<double>(), egress);
    EXPECT_EQ(r["relay_egress_sizes"].get<std::vector<double>>(), relays);
    ExpectSamples(r["first_s"], name + " first", 2);
    ExpectSamples(r["last_s"], name + " last", 2);
    EXPECT_LE(r["first_s"]["median"].get<double>(), r["last_s"]["median"].get<double>());
    EXPECT_GE(r["cpu_s_per_update"].get<double>(), 0.0);  // 10 ms ticks: a tiny model may read 0
  }
  const json& w = f["wire"];
  EXPECT_EQ(w["error"], "") << w.dump();
  EXPECT_EQ(w["single_gbps"].size(), 3u);  // 3 streams (--quick: before the rows only)
  EXPECT_EQ(w["chain_gbps"].size(), 2u);   // one median per hop
  EXPECT_GT(w["chain_verify_s"].get<double>(), 0.0);
  EXPECT_EQ(f["targets"].size(), 2u);
}

}  // namespace
}  // namespace viper
