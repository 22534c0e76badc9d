// `viper bench --only delta --quick` end to end on small models: real producer and consumer
// processes over UCX, the real torch models of bench/delta_models.py, the raw UCX baseline. Checks
// that every row prints and that the figures are sane (sizes and counts, never speed): the bf16
// case compresses well, half-frozen layers are at least ~half the bytes, every "always" update came
// as a delta and every "off" one as the full snapshot.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench/bench_test_util.h"

namespace viper {
namespace {

TEST(BenchCli, DeltaRowsPrintWithSaneRatios) {
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  Outcome o = RunViper({"bench", "--only", "delta", "--quick", "--delta-bytes", "4Mi", "--file-dir",
                        dir.path().string(), "--json", json_path},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (const char* line : {"== delta updates", "(a) bf16", "(b) fp32, one SGD step", "(c) fp32, half the layers frozen",
                           "baselines, same run: UCX tag_bw", "== targets"})
    EXPECT_NE(o.out.find(line), std::string::npos) << line << "\n" << o.out;
  EXPECT_EQ(o.out.find("warm memcpy"), std::string::npos) << "--only delta runs no sizes";
  json j = json::parse(testing::ReadFile(json_path));
  const json& d = j["sections"]["delta"];
  const size_t reps = j["reps"].get<size_t>();
  ASSERT_EQ(reps, 2u);
  for (const char* key : {"a_bf16_rl", "b_fp32_sgd", "c_half_frozen"}) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(d.contains(key)) << d.dump();
    const json& k = d[key];
    const double bytes = k["bytes"].get<double>();
    EXPECT_GE(bytes, 3.0 * (1 << 20));
    EXPECT_LE(bytes, 5.0 * (1 << 20));
    for (const char* mode : {"full", "auto", "always"}) {
      ExpectSamples(k[mode]["e2e_s"], std::string(mode) + " e2e", reps);
      EXPECT_EQ(k[mode]["wire_bytes"]["n"].get<size_t>(), reps) << mode;
      EXPECT_GT(k[mode]["wire_bytes"]["min"].get<double>(), 0.0) << mode;
    }
    EXPECT_EQ(k["full"]["deltas"], 0);
    EXPECT_EQ(k["always"]["deltas"].get<size_t>(), reps);
    EXPECT_LE(k["auto"]["deltas"].get<size_t>(), reps);
    EXPECT_DOUBLE_EQ(k["full"]["wire_bytes"]["min"].get<double>(), bytes);
    EXPECT_LT(k["always"]["wire_bytes"]["max"].get<double>(), bytes * 1.01);  // a delta never costs more than ~full
    const double ratio = k["ratio_full_over_delta"].get<double>();
    EXPECT_DOUBLE_EQ(ratio, bytes / k["always"]["wire_bytes"]["median"].get<double>());
    const json& b = k["baseline"];
    for (const char* g : {"ucx_snapshot_gbps", "ucx_delta_gbps", "tcp_snapshot_gbps", "tcp_delta_gbps"})
      EXPECT_GT(b[g].get<double>(), 0.0) << g;
    EXPECT_DOUBLE_EQ(b["delta_bytes"].get<double>(), k["always"]["wire_bytes"]["median"].get<double>());
  }
  // Sizes only, which do not depend on the machine's load: ~1% of bf16 elements by one ulp is
  // sparse; half the layers frozen drops about half the bytes; one SGD step still compresses a bit.
  EXPECT_GT(d["a_bf16_rl"]["ratio_full_over_delta"].get<double>(), 10.0);
  EXPECT_GT(d["c_half_frozen"]["ratio_full_over_delta"].get<double>(), 1.5);
  EXPECT_GT(d["b_fp32_sgd"]["ratio_full_over_delta"].get<double>(), 1.0);
  bool size_a = false, size_c = false;
  for (const json& t : j["targets"]) {
    size_a |= t["name"] == "delta (a) bf16 ~1%: full/delta size";
    size_c |= t["name"] == "delta (c) half frozen: full/delta size";
  }
  EXPECT_TRUE(size_a && size_c) << j["targets"].dump();
  // The models were made under the run's directory and removed with it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 3) << "only bench.json, stdout, stderr";
}

// `viper bench --only delta-chain --quick`: the three rows print with their baselines, and the
// counts say what each chain did (never speed): the relays that pass the delta on encoded nothing,
// the ones told not to encoded one delta per update each, and every update reached the consumer
// as a delta.
TEST(BenchCli, DeltaChainRowsPrintAndTheRelaysPassTheDeltaOn) {
  testing::TempDir dir;
  auto json_path = (dir / "bench.json").string();
  Outcome o = RunViper({"bench", "--only", "delta-chain", "--quick", "--delta-bytes", "4Mi", "--file-dir",
                        dir.path().string(), "--json", json_path},
                       dir);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (const char* line : {"== deltas through a chain of 2 relays", "direct: on the producer's node (baseline)",
                           "chain: each relay passes the delta on", "chain: each relay encodes its own",
                           "one warm memcpy of the version", "the delta's bytes over a TCP stream"})
    EXPECT_NE(o.out.find(line), std::string::npos) << line << "\n" << o.out;
  json j = json::parse(testing::ReadFile(json_path));
  const json& d = j["sections"]["delta-chain"];
  const size_t reps = j["reps"].get<size_t>(), warmup = j["warmup"].get<size_t>();
  const uint64_t deltas_per_relay = reps + warmup;  // every update but the first has a base
  EXPECT_EQ(d["relays"], 2);
  for (const char* row : {"direct", "passed_on", "encoded_per_relay"}) {
    SCOPED_TRACE(row);
    ExpectSamples(d[row]["e2e_s"], std::string(row) + " e2e", reps);
    EXPECT_EQ(d[row]["deltas"].get<size_t>(), reps);
    EXPECT_LT(d[row]["wire_bytes"]["max"].get<double>(), d["bytes"].get<double>() / 10);
  }
  EXPECT_EQ(d["passed_on"]["relays_forwarded"].get<uint64_t>(), 2 * deltas_per_relay);
  EXPECT_EQ(d["passed_on"]["relays_encoded"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["encoded_per_relay"]["relays_forwarded"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["encoded_per_relay"]["relays_encoded"].get<uint64_t>(), 2 * deltas_per_relay);
  EXPECT_GT(d["baseline"]["tcp_delta_gbps"].get<double>(), 0.0);
  EXPECT_EQ(d["baseline"]["memcpy_s"]["n"].get<size_t>(), 3u);
}

TEST(BenchCli, OnlyRefusesAnUnknownPart) {
  testing::TempDir dir;
  Outcome o = RunViper({"bench", "--only", "deltas", "--file-dir", dir.path().string()}, dir);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("--only: 'deltas' must be one of delta"), std::string::npos) << o.out << o.err;
}

}  // namespace
}  // namespace viper
