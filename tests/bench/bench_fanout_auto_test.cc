// `viper bench --fanout --auto --quick` on three network namespaces (root, labelled netns): the
// relays find their parents through a real redis-server (no upstream written down), every consumer
// is live on every version with the producer's checksum (each hashes what it maps), and the heal
// happened: the relay under the producer is killed while a version is on its way, its child
// re-attaches to the producer through the registry, and every surviving consumer gets that version
// and the next. A structural check, never a speed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "bench/bench_test_util.h"

namespace viper {
namespace {

TEST(BenchFanoutAuto, RegistryPlacesTheRelaysAndHealsAKilledOne) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root (network namespaces); exclude with ctest -LE netns";
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  // 8 MiB over links shaped to 200 Mbit/s: ~0.34 s a transfer, so the kill lands mid-transfer.
  Outcome o = RunViper({"bench", "--fanout", "--auto", "--quick", "--sizes", "8Mi", "--fanout-hosts", "3", "--consumers", "6",
                        "--link-rate", "200mbit", "--fanout-verify", "--file-dir", dir.path().string(), "--json", json_path,
                        "--hosts-script", std::string(VIPER_SOURCE_DIR) + "/scripts/hosts.sh"},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("fan-out placed by the registry"), std::string::npos) << o.out;
  const json f = json::parse(testing::ReadFile(json_path))["fanout_auto"];
  EXPECT_EQ(f["hosts"], 3);
  EXPECT_EQ(f["verify"], true);
  ASSERT_EQ(f["rows"].size(), 2u);
  const json& single = f["rows"][0];
  const json& placed = f["rows"][1];
  EXPECT_EQ(single["name"], "single");
  EXPECT_EQ(placed["name"], "placed");
  EXPECT_EQ(placed["consumers"], 6);
  // Every consumer reported every version (1 warm-up + 2 timed) with the producer's checksum.
  EXPECT_EQ(placed["checksums_checked"], 6 * 3);
  EXPECT_EQ(placed["checksums_wrong"], 0);
  EXPECT_EQ(placed["paths"], json::array({"map"}));
  ExpectSamples(placed["last_s"], "placed last", 2);
  // The tree the registry made: the producer takes one child, a relay one (the default): a chain.
  const json& tree = f["tree"];
  ASSERT_EQ(tree.size(), 2u) << tree.dump();
  std::string top, below;
  for (const auto& [relay, parent] : tree.items()) (parent == "h1" ? top : below) = relay;
  ASSERT_FALSE(top.empty()) << tree.dump();
  ASSERT_FALSE(below.empty()) << tree.dump();
  EXPECT_EQ(tree[below], top) << tree.dump();
  // One copy out of the producer per update, one out of the top relay, none out of the last.
  EXPECT_DOUBLE_EQ(placed["producer_egress_sizes"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(single["producer_egress_sizes"].get<double>(), 1.0);
  EXPECT_EQ(f["receive"].size(), 4u);  // h2's and h3's consumers: behind a link
  for (const auto& c : f["receive"]) EXPECT_GT(c["of_link"].get<double>(), 0.0);
  // The heal: the top relay killed, its child under the producer, everyone else live on both
  // versions (h1's two consumers and the orphan's two).
  const json& h = f["heal"];
  EXPECT_EQ(h["victim"], top);
  EXPECT_EQ(h["orphans"], json::array({below}));
  EXPECT_EQ(h["tree_after"], json({{below, "h1"}}));
  EXPECT_GT(h["kill_after_publish_s"].get<double>(), 0.0);
  EXPECT_GT(h["rejoin_s"].get<double>(), 0.0);
  EXPECT_GT(h["heal_s"].get<double>(), 0.0);
  EXPECT_EQ(h["survivors"], 4);
  EXPECT_DOUBLE_EQ(h["egress_next_sizes"].get<double>(), 1.0);
  // The killed node's segments are gone.
  const std::string prefix = "viperfan" + std::to_string(h["victim_pid"].get<int>()) + ".";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_FALSE(e.path().filename().string().starts_with(prefix)) << e.path();
  EXPECT_EQ(f["wire"]["error"], "") << f["wire"].dump();
  EXPECT_EQ(f["targets"].size(), 4u);
}

}  // namespace
}  // namespace viper
