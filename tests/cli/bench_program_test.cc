// The benchmark lives in its own program: the shipped bin/viper does not link the harness, and
// `viper bench` / `viper bench-peer` exec bin/viper-bench beside it with the same arguments, so
// every existing command keeps its output, messages and exit codes. Real programs, run as a user
// would.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "api/process.h"
#include "cli/run_viper.h"

namespace viper {
namespace {

using testing::Outcome;
using testing::RunProgram;
using testing::RunViper;

const std::string kBin = std::string(VIPER_BINARY_DIR) + "/bin";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Text that only the benchmark's code holds: a help line of its flags (tools/viper-bench) and a
// JSON key of the harness (bench/harness/bench.cc). String literals survive stripping.
const char* const kBenchOnly[] = {"Only the fan-out benchmark", "speedup_vs_file_poll_expected"};

TEST(BenchProgram, ViperDoesNotLinkTheHarness) {
  std::string viper = Slurp(kBin + "/viper"), bench = Slurp(kBin + "/viper-bench");
  ASSERT_GT(viper.size(), 100000u);
  ASSERT_GT(bench.size(), 100000u);
  for (const char* text : kBenchOnly) {
    EXPECT_EQ(viper.find(text), std::string::npos) << "bin/viper holds \"" << text << "\"";
    EXPECT_NE(bench.find(text), std::string::npos) << "bin/viper-bench lacks \"" << text << "\"";
  }
}

// `viper bench ARGS`, `viper-bench bench ARGS` and `viper-bench ARGS` are one command.
TEST(BenchProgram, ViperBenchIsTheSameCommand) {
  testing::TempDir dir;
  const std::vector<std::vector<std::string>> cases = {{"--hosts", "3"}, {"--sizes", "12x"}, {"--help"}};
  for (const auto& args : cases) {
    SCOPED_TRACE(args[0]);
    std::vector<std::string> named = {"bench"};
    named.insert(named.end(), args.begin(), args.end());
    Outcome via_viper = RunViper(named, dir.path());
    Outcome direct = RunProgram(kBin + "/viper-bench", args, dir.path());
    Outcome direct_named = RunProgram(kBin + "/viper-bench", named, dir.path());
    EXPECT_EQ(via_viper.exit_code, args[0] == "--help" ? 0 : 2) << via_viper.err;
    for (const Outcome* o : {&direct, &direct_named}) {
      EXPECT_EQ(o->exit_code, via_viper.exit_code);
      EXPECT_EQ(o->out, via_viper.out);
      EXPECT_EQ(o->err, via_viper.err);
    }
  }
  Outcome refused = RunViper({"bench", "--hosts", "3"}, dir.path());
  EXPECT_EQ(refused.err, "viper bench: --hosts: '3' must be an integer from 1 to 2 (decimal digits) (see viper bench --help)\n");
  Outcome help = RunViper({"bench", "--help"}, dir.path());
  EXPECT_NE(help.out.find("--fanout-hosts"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("Exit codes:"), std::string::npos) << help.out;
  // The hidden consumer command is forwarded too (its own checks refuse a missing --connect).
  Outcome peer = RunViper({"bench-peer", "subscribe"}, dir.path());
  EXPECT_EQ(peer.exit_code, 2);
  EXPECT_EQ(peer.err, "viper bench-peer: --connect is required (see viper bench-peer --help)\n");
  // `viper --help` lists bench, not the internal bench-peer.
  Outcome top = RunViper({"--help"}, dir.path());
  EXPECT_NE(top.out.find("  bench "), std::string::npos) << top.out;
  EXPECT_EQ(top.out.find("bench-peer"), std::string::npos) << top.out;
}

// A viper without viper-bench beside it says what is missing, in one line, exit code 1.
TEST(BenchProgram, MissingBenchProgramIsNamed) {
  testing::TempDir dir;
  std::filesystem::copy_file(kBin + "/viper", dir / "viper");
  std::filesystem::permissions(dir / "viper", std::filesystem::perms::owner_all);
  Outcome o = RunProgram((dir / "viper").string(), {"bench", "--quick"}, dir.path());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "viper bench: cannot run " + (dir / "viper-bench").string() +
                       ": No such file or directory (the benchmark program, installed beside viper; builds with "
                       "VIPER_BUILD_BENCH=OFF have none)\n");
  // The other commands do not need it.
  EXPECT_EQ(RunProgram((dir / "viper").string(), {"--version"}, dir.path()).exit_code, 0);
}

}  // namespace
}  // namespace viper
