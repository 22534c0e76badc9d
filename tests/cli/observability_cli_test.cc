// Observability from the outside: `viper stats --prometheus` scraped from a real `viper serve`
// after publishes (CLI) and SEND fetches (a client), parsed here as a scraper would; the log line's
// format; --log-level on every command, winning over VIPER_LOG.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "api/client.h"
#include "api/process.h"
#include "cli/run_viper.h"
#include "cli/serve_process.h"
#include "viper/metrics.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Outcome;
using testing::Process;
using testing::RunViper;

// Starts `viper serve` on loopback with `extra` arguments; returns its address ("" if it did not
// come up within 30 s).
std::string StartServe(std::unique_ptr<Process>& serve, const std::filesystem::path& dir, const std::string& tag,
                       std::vector<std::string> extra = {}) {
  return testing::StartServe(serve, dir, tag, "obs" + tag, extra);
}

struct Exposition {
  std::map<std::string, std::string> types;              // metric family -> type
  std::map<std::string, double> samples;                 // sample name (with labels) -> value
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // family -> (le, cumulative)
};

// Parses the text exposition format strictly enough to refuse what a scraper would.
void Parse(const std::string& text, Exposition& e) {
  e = {};
  static const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|untyped)$)");
  static const std::regex help_line(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
  static const std::regex sample_line(R"re(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{le="([^"]+)"\})? ([0-9.e+-]+|\+Inf)$)re");
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    SCOPED_TRACE(line);
    std::smatch m;
    if (std::regex_match(line, m, type_line)) {
      EXPECT_TRUE(e.types.emplace(m[1], m[2]).second) << "a second TYPE line";
      continue;
    }
    if (std::regex_match(line, m, help_line)) continue;
    ASSERT_TRUE(std::regex_match(line, m, sample_line)) << "not a sample line";
    const std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (name.ends_with(suffix) && e.types.count(name.substr(0, name.size() - std::strlen(suffix))) &&
          e.types.at(name.substr(0, name.size() - std::strlen(suffix))) == "histogram")
        family = name.substr(0, name.size() - std::strlen(suffix));
    }
    ASSERT_TRUE(e.types.count(family)) << "sample of a metric with no TYPE line before it";
    if (e.types.at(family) == "counter") {
      EXPECT_TRUE(name.ends_with("_total"));
    }
    const double value = std::stod(m[4]);
    if (m[2].matched) {
      ASSERT_TRUE(name.ends_with("_bucket"));
      const std::string le = m[3];
      e.buckets[family].emplace_back(le == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(le), value);
    }
    EXPECT_TRUE(e.samples.emplace(name + (m[2].matched ? std::string(m[2]) : ""), value).second) << "sample twice";
  }
}

TEST(ObservabilityCli, PrometheusScrapeAfterPublishesAndFetches) {
  testing::TempDir dir;
  std::vector<float> w(256 * 1024);  // 1 MiB: several chunks per SEND
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {static_cast<int64_t>(w.size())}}, std::as_bytes(std::span(w))}};
  auto built = BuildSnapshot(tensors, VersionStamp{.model = "obs", .step = 1}, {});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  const std::string file = (dir / "model.safetensors").string();
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(built->bytes().data()), static_cast<std::streamsize>(built->bytes().size()));

  std::unique_ptr<Process> serve;
  const std::string address = StartServe(serve, dir.path(), "scrape");
  ASSERT_FALSE(address.empty()) << serve->log();
  constexpr int kPublishes = 3, kFetches = 2;
  for (int i = 0; i < kPublishes; ++i) {
    Outcome r = RunViper({"publish", "obs", file, "--connect", address}, dir.path(), 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  ClientOptions options;
  options.connect = address;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<std::byte> buffer;
  for (int i = 0; i < kFetches; ++i) {
    auto got = (*client)->FetchSend("obs", 0, [&](const proto::VersionInfo& vi) -> Result<std::span<std::byte>> {
      buffer.resize(vi.size);
      return std::span<std::byte>(buffer);
    });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
  }

  // The node counts a SEND when its last chunk's send completes, which may follow the client's
  // receipt by a moment: scrape until both fetches are counted.
  Exposition e;
  std::string text;
  bool counted = testing::WaitUntil([&] {
    Outcome r = RunViper({"stats", "--prometheus", "--connect", address}, dir.path(), 30s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    text = r.out;
    Parse(text, e);
    return e.samples.count("viper_fetch_send_seconds_count") && e.samples["viper_fetch_send_seconds_count"] >= kFetches;
  }, 10s);
  ASSERT_TRUE(counted) << text;
  std::printf("scraped %zu metric families, %zu samples\n", e.types.size(), e.samples.size());

  EXPECT_EQ(e.types["viper_versions_committed_total"], "counter");
  EXPECT_EQ(e.samples["viper_versions_committed_total"], kPublishes);
  EXPECT_EQ(e.types["viper_peers"], "gauge");
  EXPECT_GE(e.samples["viper_peers"], 1);  // this test's client
  EXPECT_GE(e.samples["viper_bytes_sent_total"], static_cast<double>(kFetches * built->bytes().size()));
  EXPECT_EQ(e.types["viper_host_free_segments"], "gauge");
  for (const std::string family : {"viper_publish_live_seconds", "viper_fetch_send_seconds"}) {
    SCOPED_TRACE(family);
    EXPECT_EQ(e.types[family], "histogram");
    const auto& b = e.buckets[family];
    ASSERT_GE(b.size(), 2u);
    for (size_t i = 1; i < b.size(); ++i) {
      EXPECT_LT(b[i - 1].first, b[i].first) << "le ascending";
      EXPECT_LE(b[i - 1].second, b[i].second) << "cumulative";
    }
    EXPECT_EQ(b.back().first, std::numeric_limits<double>::infinity()) << "ends with +Inf";
    EXPECT_EQ(b.back().second, e.samples[family + "_count"]) << "+Inf == _count";
    EXPECT_TRUE(e.samples.count(family + "_sum"));
    EXPECT_GT(e.samples[family + "_sum"], 0);
  }
  EXPECT_EQ(e.samples["viper_publish_live_seconds_count"], kPublishes);
  EXPECT_EQ(e.samples["viper_fetch_send_seconds_count"], kFetches);

  // The plain listing summarises the histograms instead of printing their buckets.
  Outcome plain = RunViper({"stats", "--connect", address}, dir.path(), 30s);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("publish_live latency"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find(std::to_string(kPublishes) + " observed"), std::string::npos) << plain.out;
  EXPECT_EQ(plain.out.find("hist_"), std::string::npos) << plain.out;
  // --json keeps every counter by name, histograms as hist_* counters (what STATS_REPLY carries).
  Outcome json = RunViper({"stats", "--json", "--connect", address}, dir.path(), 30s);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(json.out.find("\"hist_publish_live_us_sum\""), std::string::npos) << json.out;
  Outcome both = RunViper({"stats", "--json", "--prometheus", "--connect", address}, dir.path(), 30s);
  EXPECT_EQ(both.exit_code, 2) << both.err;
  client->reset();
  serve->Kill(SIGTERM);
}

// Every counter a node reports has a type and a help text in the exposition (not "untyped"): a
// counter added to NodeStats without an entry in metrics.cc fails here.
TEST(ObservabilityCli, EveryNodeCounterIsTyped) {
  const auto counters = StatsCounters(NodeStats{});
  const std::string text = PrometheusText(counters);
  for (const auto& [name, value] : counters) {
    if (IsHistogramCounter(name)) continue;
    SCOPED_TRACE(name);
    const bool counter = text.find("# TYPE viper_" + name + "_total counter\n") != std::string::npos;
    const bool gauge = text.find("# TYPE viper_" + name + " gauge\n") != std::string::npos;
    EXPECT_TRUE(counter != gauge) << text;
    EXPECT_EQ(text.find("A node counter this viper does not know"), std::string::npos);
  }
}

// Every command `viper --help` lists.
std::vector<std::string> Commands(const std::filesystem::path& dir) {
  Outcome top = RunViper({"--help"}, dir);
  EXPECT_EQ(top.exit_code, 0) << top.err;
  std::vector<std::string> commands;
  std::istringstream lines(top.out);
  bool in_subcommands = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("Subcommands")) in_subcommands = true;
    else if (!line.empty() && line[0] != ' ') in_subcommands = false;
    else if (in_subcommands && line.size() > 2) commands.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return commands;
}

TEST(ObservabilityCli, LogLevelOnEveryCommand) {
  testing::TempDir dir;
  const auto commands = Commands(dir.path());
  ASSERT_GE(commands.size(), 8u);
  for (const std::string& command : commands) {
    SCOPED_TRACE(command);
    Outcome help = RunViper({command, "--help"}, dir.path());
    EXPECT_EQ(help.exit_code, 0) << help.err;
    EXPECT_NE(help.out.find("--log-level"), std::string::npos) << help.out;
    Outcome bad = RunViper({command, "--log-level", "loud"}, dir.path(), 10s);
    EXPECT_EQ(bad.exit_code, 2) << bad.err;
    EXPECT_NE(bad.err.find("--log-level"), std::string::npos) << bad.err;
    EXPECT_NE(bad.err.find("'loud' must be one of error, warn, info, debug"), std::string::npos) << bad.err;
  }
}

// Log lines of `viper serve` under VIPER_LOG=`env` (unset if empty) and --log-level `flag` (none
// if empty), once it is listening.
std::vector<std::string> ServeLogLines(const std::string& env, const std::string& flag, pid_t* pid) {
  testing::TempDir dir;
  if (env.empty()) ::unsetenv("VIPER_LOG");
  else ::setenv("VIPER_LOG", env.c_str(), 1);
  std::unique_ptr<Process> serve;
  std::vector<std::string> extra;
  if (!flag.empty()) extra = {"--log-level", flag};
  const std::string address = StartServe(serve, dir.path(), "log", extra);
  ::unsetenv("VIPER_LOG");
  EXPECT_FALSE(address.empty()) << serve->log();
  *pid = serve->pid();
  serve->Kill(SIGTERM);
  std::vector<std::string> out;
  std::istringstream lines(serve->log());
  for (std::string line; std::getline(lines, line);)
    if (!line.starts_with("viper serve:")) out.push_back(line);  // its stdout: what it tells the user
  return out;
}

TEST(ObservabilityCli, LogLinesCarryTimePidThreadAndTheFlagWins) {
  static const std::regex format(
      R"(^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z viper\[(\d+)/(\d+)\] (error|warn|info|debug) ([a-z_]+): .+$)");
  pid_t pid = 0;
  // VIPER_LOG=error, --log-level info: info lines, in the format.
  auto lines = ServeLogLines("error", "info", &pid);
  bool listening = false;
  for (const std::string& line : lines) {
    SCOPED_TRACE(line);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, format));
    EXPECT_EQ(std::stol(m[8]), pid);
    EXPECT_GT(std::stol(m[9]), 0);
    EXPECT_GE(std::stoi(m[1]), 2024);
    if (m[10] == "info" && line.find("listening on") != std::string::npos) listening = true;
  }
  EXPECT_TRUE(listening) << "no info line \"listening on\" with --log-level info over VIPER_LOG=error";
  // VIPER_LOG=info alone still works...
  lines = ServeLogLines("info", "", &pid);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) { return l.find(" info node: ") != std::string::npos; }));
  // ...and --log-level error silences it.
  lines = ServeLogLines("info", "error", &pid);
  for (const std::string& line : lines) EXPECT_EQ(line.find(" info "), std::string::npos) << line;
}

// A VIPER_LOG the program does not know is reported as it starts, also by a command that logs
// nothing else (before, only at the first log line, which such a command never wrote).
TEST(ObservabilityCli, AnUnknownViperLogIsReportedAtOnce) {
  testing::TempDir dir;
  ::setenv("VIPER_LOG", "verbose", 1);
  Outcome o = RunViper({"inspect", (dir.path() / "absent.safetensors").string()}, dir.path());
  ::unsetenv("VIPER_LOG");
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("VIPER_LOG=verbose is not one of error|warn|info|debug; using warn"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace viper
