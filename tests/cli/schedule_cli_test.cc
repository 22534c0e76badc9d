// `viper schedule`: the real binary on generated loss logs (the worked example, bad logs, bad
// flags).

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/run_viper.h"
#include "core/snapshot_bytes.h"

namespace {

using Output = viper::testing::Outcome;

// This process's own directory, removed at exit (two runs at once never share a log).
const std::filesystem::path& Dir() {
  static viper::testing::TempDir dir;
  return dir.path();
}

// Runs bin/viper with `args`, stdout and stderr captured through files of Dir().
Output RunViper(const std::vector<std::string>& args) { return viper::testing::RunViper(args, Dir()); }

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = (Dir() / name).string();
  std::ofstream(path) << text;
  return path;
}

// The worked example's curve at iterations 0..400, then (after the warm-up end 100) rows that
// would change the fit if they were used.
std::string WorkedLog() {
  std::string csv = "iteration,loss\n";
  char row[64];
  for (int x = 0; x <= 400; ++x) {
    const double loss = x <= 100 ? 2.0 * std::exp(-0.01 * x) + 0.1 : 5.0 + 0.1 * (x % 3);
    std::snprintf(row, sizeof row, "%d,%.17g\n", x, loss);
    csv += row;
  }
  return csv;
}

std::vector<std::string> WorkedArgs(const std::string& log) {
  return {"schedule", "--loss-log", log, "--warmup-end", "100", "--end", "400", "--epoch", "50", "--t-train",
          "0.1", "--t-p", "0.5", "--t-c", "0.3", "--t-infer", "0.01", "--requests", "5000"};
}

const nlohmann::json* Find(const nlohmann::json& array, const std::string& name) {
  for (const auto& o : array) {
    if (o.at("name") == name) return &o;
  }
  return nullptr;
}

TEST(ScheduleCli, WorkedExampleJson) {
  std::vector<std::string> args = WorkedArgs(WriteFile("worked.csv", WorkedLog()));
  args.push_back("--json");
  const Output o = RunViper(args);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  const nlohmann::json j = nlohmann::json::parse(o.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 6u);
  for (const char* name : {"none", "epoch", "fixed", "greedy", "sqrt", "optimal"}) {
    const nlohmann::json* s = Find(j, name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->at("checkpoints").get<size_t>(), s->at("schedule").size()) << name;
    EXPECT_LE(Find(j, "optimal")->at("cil").get<double>(), s->at("cil").get<double>() + 1e-9) << name;
    const nlohmann::json& fit = s->at("fit");
    EXPECT_EQ(fit.at("family"), "exp+c");
    EXPECT_NEAR(fit.at("params").at("a").get<double>(), 2.0, 1e-6);
    EXPECT_NEAR(fit.at("params").at("b").get<double>(), 0.01, 1e-8);
    EXPECT_NEAR(fit.at("params").at("c").get<double>(), 0.1, 1e-7);
    EXPECT_EQ(fit.at("samples"), 101);  // rows up to the warm-up end only
  }
  EXPECT_NEAR(Find(j, "none")->at("cil").get<double>(), 4178.794412, 1e-6);
  EXPECT_NEAR(Find(j, "epoch")->at("cil").get<double>(), 1560.502769, 1e-6);
  EXPECT_EQ(Find(j, "epoch")->at("schedule"), nlohmann::json({150, 200, 250, 300, 350, 400}));
  EXPECT_EQ(Find(j, "fixed")->at("interval"), 30);
  EXPECT_NEAR(Find(j, "fixed")->at("cil").get<double>(), 1520.025158, 1e-6);
  EXPECT_EQ(Find(j, "fixed")->at("schedule").front(), 130);
  EXPECT_EQ(Find(j, "optimal")->at("stride"), 1);
}

TEST(ScheduleCli, WorkedExampleText) {
  const Output o = RunViper(WorkedArgs(WriteFile("worked_text.csv", WorkedLog())));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("fit: exp+c"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("4178.794412"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("1560.502769"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("1520.025158  130 160 190 220 250 ... 370 400  (interval 30)"), std::string::npos) << o.out;
  for (const char* name : {"none ", "epoch ", "fixed ", "greedy ", "sqrt ", "optimal "}) {
    EXPECT_NE(o.out.find(std::string("\n") + name), std::string::npos) << name;
  }
}

void ExpectOneLineError(const Output& o, const std::string& want) {
  EXPECT_NE(o.exit_code, 0);
  EXPECT_EQ(o.out, "");
  ASSERT_FALSE(o.err.empty());
  EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << "one line: " << o.err;
  EXPECT_EQ(o.err.rfind("viper", 0), 0u) << o.err;
  EXPECT_NE(o.err.find(want), std::string::npos) << o.err;
}

TEST(ScheduleCli, BadLogsGiveOneLineErrors) {
  struct Case {
    const char* name;
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"no_header.csv", "0,1.0\n1,0.9\n", "missing header"},
      {"non_numeric.csv", "iteration,loss\n0,1.0\n1,abc\n", ":3: loss 'abc' is not a number"},
      {"non_monotone.csv", "iteration,loss\n0,1.0\n2,0.9\n1,0.8\n", ":4: iteration 1 does not follow 2"},
      {"nan.csv", "iteration,loss\n0,1.0\n1,nan\n", "not finite"},
      {"empty.csv", "", "empty"},
      {"header_only.csv", "iteration,loss\n", "no data rows"},
      {"late.csv", "iteration,loss\n200,1.0\n201,0.9\n", "no loss sample at or before the warm-up end 100"},
      {"too_few.csv", "iteration,loss\n0,1.0\n1,0.9\n", "no loss family fits"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Output o = RunViper(WorkedArgs(WriteFile(c.name, c.text)));
    ExpectOneLineError(o, c.want);
    EXPECT_NE(o.err.find(c.name), std::string::npos) << "names the file: " << o.err;
  }
  ExpectOneLineError(RunViper(WorkedArgs((Dir() / "does_not_exist.csv").string())), "No such file");
}

TEST(ScheduleCli, BadFlagsGiveOneLineErrors) {
  const std::string log = WriteFile("flags.csv", WorkedLog());
  struct Case {
    const char* flag;
    const char* value;
    const char* want;
  };
  const Case cases[] = {
      {"--end", "100", "must be greater than the warm-up end"},
      {"--end", "50", "must be greater than the warm-up end"},
      {"--t-train", "0", "--t-train 0 must be"},
      {"--t-infer", "-0.5", "--t-infer -0.5 must be"},
      {"--t-p", "-1", "--t-p -1 must be"},
      {"--t-train", "1e-12", "rounds to 0 ns"},
      {"--requests", "0", "requests M = 0"},
      {"--epoch", "0", "--epoch 0 must be > 0"},
      {"--t-c", "abc", "--t-c"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.flag) + " " + c.value);
    std::vector<std::string> args = WorkedArgs(log);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == c.flag) args[i + 1] = c.value;
    }
    ExpectOneLineError(RunViper(args), c.want);
  }
  ExpectOneLineError(RunViper({"schedule", "--loss-log", log}), "required");
}

}  // namespace
