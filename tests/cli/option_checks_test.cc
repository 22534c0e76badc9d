// Every option of every `viper` command refuses out-of-range, negative, empty, overlong and
// malformed values before the command runs: exit code 2, nothing on stdout, one line on stderr
// that names the command, the option and the value. Table-driven over the real bin/viper; the
// table is checked against `viper CMD --help`, so an option added without an entry here fails.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cli/run_viper.h"
#include "core/snapshot_bytes.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Outcome;
using testing::RunViper;

// The class of value an option takes; each class has its list of bad values (BadValues).
enum class Kind {
  kInteger,        // lo..hi
  kSeconds,        // lo..hi seconds (lo excluded when lo_open)
  kNumber,         // any finite number; the command checks the range
  kHostPort,
  kModel,
  kPath,           // any path text
  kReadableFile,
  kNewFile,
  kText,           // 1..hi bytes
  kRegistry,
  kChoice,
  kSegmentPrefix,
};

struct Option {
  std::string command;  // "serve", "bench-peer subscribe"
  std::string name;     // "--keep-host-versions", or a positional's name ("MODEL")
  Kind kind;
  double lo = 0, hi = 0;
  bool lo_open = false;
};

struct Bad {
  std::string value;
  std::string why;  // the class of the value: negative, empty, overlong, out-of-range, malformed
};

std::string Num(double v) { return fmt::format("{}", static_cast<int64_t>(v)); }

class OptionChecks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    std::vector<float> w = {1, 2, 3};
    std::vector<TensorData> tensors = {{{"w", DType::kF32, {3}}, std::as_bytes(std::span(w))}};
    auto built = BuildSnapshot(tensors, VersionStamp{.model = "m", .step = 1}, {});
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    file_ = (dir_->path() / "model.safetensors").string();
    testing::WriteFile(file_, built->bytes());
    log_ = (dir_->path() / "loss.csv").string();
    std::ofstream(log_) << "iteration,loss\n0,1.0\n10,0.5\n20,0.3\n30,0.2\n40,0.15\n50,0.12\n";
    token_ = (dir_->path() / "token").string();
    std::ofstream(token_) << "secret\n";
    std::filesystem::permissions(token_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Valid values for the options a command requires (and every positional), so that only the
  // option under test can be refused.
  static std::map<std::string, std::string> Base(const std::string& command) {
    if (command == "publish") return {{"MODEL", "m"}, {"FILE", file_}};
    if (command == "watch") return {{"MODEL", "m"}};
    if (command == "pull") return {{"MODEL", "m"}, {"-o", (dir_->path() / "out.safetensors").string()}};
    if (command == "inspect") return {{"file", file_}};
    if (command == "schedule")
      return {{"--loss-log", log_}, {"--warmup-end", "30"}, {"--end", "100"}, {"--epoch", "10"},
              {"--t-train", "1"}, {"--t-p", "1"}, {"--t-c", "1"}, {"--t-infer", "1"}, {"--requests", "10"}};
    if (command == "data jobs" || command == "data stats") return {{"--node", "127.0.0.1:1"}};
    if (command == "data set-budget") return {{"--node", "127.0.0.1:1"}, {"--job", "j"}, {"--readers", "1"}};
    if (command == "bench-peer subscribe") return {{"--connect", "127.0.0.1:1"}};
    if (command == "bench-peer poll") return {{"--dir", dir_->path().string()}};
    if (command == "bench-peer fanout-host") return {{"--listen", "127.0.0.1:0"}};
    return {};
  }

  // argv for `command` with `option` = `value` and the base values of the others.
  static std::vector<std::string> Args(const std::string& command, const std::string& option, const std::string& value) {
    std::vector<std::string> args;
    std::stringstream words(command);
    for (std::string w; words >> w;) args.push_back(w);
    auto base = Base(command);
    base[option] = value;
    std::vector<std::string> positionals;
    for (const auto& [name, v] : base) {
      bool positional = name[0] != '-';
      if (positional) continue;
      args.push_back(name);
      args.push_back(v);
    }
    // Positionals last, in their declared order, after "--" only when one looks like an option.
    for (const char* name : {"MODEL", "FILE", "file"})
      if (base.count(name)) positionals.push_back(base[name]);
    bool dashed = std::any_of(positionals.begin(), positionals.end(), [](const std::string& p) { return p.starts_with('-'); });
    if (dashed) args.push_back("--");
    args.insert(args.end(), positionals.begin(), positionals.end());
    return args;
  }

  static testing::TempDir* dir_;
  static std::string file_, log_, token_;
};

testing::TempDir* OptionChecks::dir_ = nullptr;
std::string OptionChecks::file_, OptionChecks::log_, OptionChecks::token_;

std::vector<Bad> BadValues(const Option& o, const std::string& dir) {
  const std::string overlong_path(5000, 'a');
  std::vector<Bad> bad = {{"", "empty"}};
  switch (o.kind) {
    case Kind::kInteger:
      bad.push_back({"-1", "negative"});
      bad.push_back({"99999999999999999999999", "overlong"});
      bad.push_back({std::string(300, '9'), "overlong"});
      if (o.lo > 0) bad.push_back({Num(o.lo - 1), "out-of-range"});
      if (o.hi < 9.2e18) bad.push_back({Num(o.hi + 1), "out-of-range"});
      for (const char* s : {"1.5", "abc", "0x10", "+1", " 1", "1e3", "18446744073709551615"})
        bad.push_back({s, "malformed"});
      break;
    case Kind::kSeconds:
      bad.push_back({"-5", "negative"});
      bad.push_back({"1" + std::string(400, '0'), "overlong"});
      bad.push_back({fmt::format("{}", o.hi * 10), "out-of-range"});
      if (o.lo > 0 || o.lo_open) bad.push_back({fmt::format("{}", o.lo_open ? o.lo : o.lo / 2), "out-of-range"});
      for (const char* s : {"inf", "nan", "1e400", "abc", "0x10", "1s"}) bad.push_back({s, "malformed"});
      break;
    case Kind::kNumber:
      bad.push_back({"1" + std::string(400, '0'), "overlong"});
      for (const char* s : {"inf", "-inf", "nan", "1e400", "abc", "0x10"}) bad.push_back({s, "malformed"});
      break;
    case Kind::kHostPort:
      bad.push_back({std::string(5000, 'h') + ":1", "overlong"});
      bad.push_back({"127.0.0.1:-1", "negative"});
      bad.push_back({"127.0.0.1:65536", "out-of-range"});
      bad.push_back({"127.0.0.1:99999999999999999999", "out-of-range"});
      for (const char* s : {"127.0.0.1", ":7300", "host name:1", "h\n:1", "127.0.0.1:", "127.0.0.1:x"})
        bad.push_back({s, "malformed"});
      break;
    case Kind::kModel:
      bad.push_back({std::string(129, 'm'), "overlong"});
      for (const char* s : {".hidden", "a/b", "a b", "caf\xc3\xa9", "a\xff"}) bad.push_back({s, "malformed"});
      break;
    case Kind::kPath:
      bad.push_back({overlong_path, "overlong"});
      bad.push_back({"a\nb", "malformed"});
      break;
    case Kind::kReadableFile:
      bad.push_back({overlong_path, "overlong"});
      bad.push_back({"/nonexistent/x", "malformed"});
      bad.push_back({dir, "malformed"});  // a directory
      break;
    case Kind::kNewFile:
      bad.push_back({overlong_path, "overlong"});
      bad.push_back({"/nonexistent/x", "malformed"});
      bad.push_back({dir, "malformed"});  // a directory
      bad.push_back({dir + "/sub/", "malformed"});
      break;
    case Kind::kText:
      bad.push_back({std::string(static_cast<size_t>(o.hi) + 1, 't'), "overlong"});
      bad.push_back({"a\tb", "malformed"});
      break;
    case Kind::kRegistry:
      bad.push_back({"redis://" + std::string(5000, 'r'), "overlong"});
      for (const char* s : {"http://127.0.0.1:6379", "127.0.0.1:6379", "redis://a\nb"}) bad.push_back({s, "malformed"});
      break;
    case Kind::kChoice:
      bad.push_back({std::string(5000, 'c'), "overlong"});
      bad.push_back({"bogus", "malformed"});
      bad.push_back({"-1", "negative"});
      break;
    case Kind::kSegmentPrefix:
      bad.push_back({std::string(65, 'p'), "overlong"});
      for (const char* s : {"a.b", "a/b", "a b"}) bad.push_back({s, "malformed"});
      break;
  }
  return bad;
}

constexpr double kMax = 9.3e18;  // no upper bound (INT64_MAX)

const std::map<std::string, std::set<std::string>>& Flags();

const std::vector<Option>& Table() {
  static const std::vector<Option> table = {
      {"serve", "--listen", Kind::kHostPort},
      {"serve", "--advertise", Kind::kText, 0, 253},
      {"serve", "--store-dir", Kind::kPath},
      {"serve", "--keep-host-versions", Kind::kInteger, 1, 100000},
      {"serve", "--keep-file-versions", Kind::kInteger, 1, 100000},
      {"serve", "--host-max-bytes", Kind::kText, 0, 32},
      {"serve", "--host-max-models", Kind::kInteger, 0, 1000000},
      {"serve", "--name", Kind::kText, 0, 255},
      {"serve", "--segment-prefix", Kind::kSegmentPrefix},
      {"serve", "--delta", Kind::kChoice},
      {"serve", "--delta-bases", Kind::kInteger, 0, 100000},
      {"serve", "--peer-liveness", Kind::kSeconds, 0.1, 3600},  // or 0 (off)
      {"serve", "--address-file", Kind::kNewFile},
      {"serve", "--registry", Kind::kRegistry},
      {"serve", "--registry-password-file", Kind::kReadableFile},
      {"serve", "--registry-ttl", Kind::kSeconds, 0.3, 86400},
      {"serve", "--upstream", Kind::kHostPort},
      {"serve", "--relay-model", Kind::kModel},
      {"serve", "--max-children", Kind::kInteger, 1, 1024},
      {"serve", "--upstream-alternate", Kind::kHostPort},
      {"serve", "--upstream-liveness", Kind::kSeconds, 0.1, 3600},  // or 0 (off)
      {"serve", "--upstream-file-dir", Kind::kPath},
      {"serve", "--token-file", Kind::kReadableFile},
      {"publish", "MODEL", Kind::kModel},
      {"publish", "FILE", Kind::kReadableFile},
      {"publish", "--step", Kind::kInteger, 0, kMax},
      {"publish", "--connect", Kind::kHostPort},
      {"publish", "--token-file", Kind::kReadableFile},
      {"watch", "MODEL", Kind::kModel},
      {"watch", "--connect", Kind::kHostPort},
      {"watch", "--path", Kind::kChoice},
      {"watch", "--file-dir", Kind::kPath},
      {"watch", "--alternate", Kind::kHostPort},
      {"watch", "--liveness", Kind::kSeconds, 0.1, 3600},  // or 0 (off)
      {"watch", "--registry", Kind::kRegistry},
      {"watch", "--registry-password-file", Kind::kReadableFile},
      {"watch", "--count", Kind::kInteger, 0, kMax},
      {"watch", "--timeout", Kind::kSeconds, 0, 365 * 86400.0},
      {"watch", "--token-file", Kind::kReadableFile},
      {"pull", "MODEL", Kind::kModel},
      {"pull", "--version", Kind::kInteger, 0, kMax},
      {"pull", "-o", Kind::kNewFile},
      {"pull", "--connect", Kind::kHostPort},
      {"pull", "--registry", Kind::kRegistry},
      {"pull", "--registry-password-file", Kind::kReadableFile},
      {"pull", "--token-file", Kind::kReadableFile},
      {"ls", "--connect", Kind::kHostPort},
      {"ls", "--registry", Kind::kRegistry},
      {"ls", "--registry-password-file", Kind::kReadableFile},
      {"ls", "--token-file", Kind::kReadableFile},
      {"stats", "--connect", Kind::kHostPort},
      {"stats", "--token-file", Kind::kReadableFile},
      {"inspect", "file", Kind::kPath},
      {"schedule", "--loss-log", Kind::kPath},
      {"schedule", "--warmup-end", Kind::kInteger, 0, kMax},
      {"schedule", "--end", Kind::kInteger, 0, kMax},
      {"schedule", "--epoch", Kind::kInteger, 0, kMax},
      {"schedule", "--t-train", Kind::kNumber},
      {"schedule", "--t-p", Kind::kNumber},
      {"schedule", "--t-c", Kind::kNumber},
      {"schedule", "--t-infer", Kind::kNumber},
      {"schedule", "--requests", Kind::kInteger, 0, kMax},
      {"schedule", "--max-cells", Kind::kInteger, 1, kMax},
      {"bench", "--sizes", Kind::kText, 0, 256},
      {"bench", "--reps", Kind::kInteger, 1, 1000000},
      {"bench", "--warmup", Kind::kInteger, 0, 1000000},
      {"bench", "--baseline-reps", Kind::kInteger, 1, 1000000},
      {"bench", "--notify-count", Kind::kInteger, 1, 1000000},
      {"bench", "--poll-interval", Kind::kSeconds, 0, 3600, true},
      {"bench", "--file-dir", Kind::kPath},
      {"bench", "--json", Kind::kNewFile},
      {"bench", "--hosts", Kind::kInteger, 1, 2},
      {"bench", "--subscribers", Kind::kInteger, 0, 4096},
      {"bench", "--hosts-script", Kind::kReadableFile},
      {"bench", "--hosts-stage", Kind::kInteger, 0, 64},
      {"bench", "--fanout-hosts", Kind::kInteger, 2, 64},
      {"bench", "--consumers", Kind::kInteger, 1, 4096},
      {"bench", "--link-rate", Kind::kText, 0, 32},
      {"bench", "--max-children", Kind::kInteger, 1, 1024},
      {"bench", "--only", Kind::kChoice},
      {"bench", "--delta-bytes", Kind::kText, 0, 32},
      {"bench", "--delta-threads", Kind::kInteger, 1, 256},
      {"bench", "--delta-models", Kind::kPath},
      {"data jobs", "--node", Kind::kHostPort},
      {"data jobs", "--token-file", Kind::kReadableFile},
      {"data stats", "--node", Kind::kHostPort},
      {"data stats", "--token-file", Kind::kReadableFile},
      {"data set-budget", "--node", Kind::kHostPort},
      {"data set-budget", "--token-file", Kind::kReadableFile},
      {"data set-budget", "--job", Kind::kText, 0, 128},
      {"data set-budget", "--readers", Kind::kInteger, 1, 1024},
      {"data set-budget", "--memory", Kind::kText, 0, 32},
      {"bench-peer subscribe", "--connect", Kind::kHostPort},
      {"bench-peer subscribe", "--model", Kind::kModel},
      {"bench-peer subscribe", "--path", Kind::kChoice},
      {"bench-peer subscribe", "--token-file", Kind::kReadableFile},
      {"bench-peer poll", "--dir", Kind::kPath},
      {"bench-peer poll", "--interval", Kind::kSeconds, 0, 3600, true},
      {"bench-peer fanout-host", "--listen", Kind::kHostPort},
      {"bench-peer fanout-host", "--upstream", Kind::kHostPort},
      {"bench-peer fanout-host", "--connect", Kind::kHostPort},
      {"bench-peer fanout-host", "--model", Kind::kModel},
      {"bench-peer fanout-host", "--path", Kind::kChoice},
      {"bench-peer fanout-host", "--consumers", Kind::kInteger, 1, 4096},
      {"bench-peer fanout-host", "--registry", Kind::kRegistry},
      {"bench-peer fanout-host", "--max-children", Kind::kInteger, 1, 1024},
  };
  static const std::vector<Option> with_log_level = [] {
    std::vector<Option> all = table;
    std::set<std::string> commands;
    for (const Option& o : table) commands.insert(o.command);
    for (const auto& [c, flags] : Flags()) commands.insert(c);
    for (const std::string& c : commands) all.push_back({c, "--log-level", Kind::kChoice});  // main.cc adds it to every command
    return all;
  }();
  return with_log_level;
}

// Flags take no value: given one (--json=x), they are refused as well.
const std::map<std::string, std::set<std::string>>& Flags() {
  static const std::map<std::string, std::set<std::string>> flags = {
      {"serve", {"--insecure", "--upstream-remote"}},
      {"publish", {"--json"}},
      {"watch", {"--json", "--verify-local"}},
      {"pull", {"--json"}},
      {"ls", {"--json"}},
      {"stats", {"--json", "--prometheus"}},
      {"inspect", {"--json", "--verify"}},
      {"schedule", {"--json", "--robust"}},
      {"bench", {"--quick", "--no-diagnostic-rows", "--fanout", "--gpu", "--auto", "--fanout-verify"}},
      {"bench-peer subscribe", {"--no-verify", "--verify-local"}},
      {"bench-peer fanout-host", {"--no-pipeline", "--verify-local"}},
  };
  return flags;
}

bool Built(const std::string& command, const std::filesystem::path& dir) {
  // Asked once per command, not per option: each answer is a run of bin/viper.
  static std::map<std::string, bool> built;
  std::string top = command.substr(0, command.find(' '));
  auto it = built.find(top);
  if (it == built.end()) it = built.emplace(top, RunViper({top, "--help"}, dir).exit_code == 0).first;
  return it->second;
}

// The options and positionals `viper COMMAND --help` lists (but --help), and whether each takes a
// value.
std::map<std::string, bool> HelpOptions(const std::string& command, const std::filesystem::path& dir) {
  std::vector<std::string> args;
  std::stringstream words(command);
  for (std::string w; words >> w;) args.push_back(w);
  args.push_back("--help");
  Outcome help = RunViper(args, dir);
  EXPECT_EQ(help.exit_code, 0) << help.err;
  std::map<std::string, bool> found;
  std::stringstream lines(help.out);
  std::string section;
  static const std::regex entry(R"(^  (\S+)( \S)?)");
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] != ' ') section = line;
    std::smatch m;
    if (line.size() < 3 || line[2] == ' ' || !std::regex_search(line, m, entry)) continue;
    if (section.starts_with("Subcommands") || section.starts_with("Exit codes")) continue;
    std::string names = m[1];
    bool takes_value = m[2].matched;
    // "-o,--output": -o; "--keep-host-versions,--keep-host": the first long name (the others are
    // deprecated aliases, see DeprecatedAliasesAreTheSameOption).
    std::string name = names.substr(0, names.find(','));
    if (names.starts_with("-h,")) name = "--help";
    if (names.starts_with("-o,")) name = "-o";
    if (name == "--help") continue;
    found[name] = takes_value;
  }
  return found;
}

TEST_F(OptionChecks, TableListsEveryOptionOfEveryCommand) {
  Outcome top = RunViper({"--help"}, dir_->path());
  ASSERT_EQ(top.exit_code, 0) << top.err;
  std::set<std::string> commands;
  for (const Option& o : Table()) commands.insert(o.command);
  for (const auto& [c, f] : Flags()) commands.insert(c);
  // Every command `viper --help` lists is in the table.
  std::stringstream lines(top.out);
  bool in_subcommands = false;
  size_t listed = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("Subcommands")) in_subcommands = true;
    else if (!line.empty() && line[0] != ' ') in_subcommands = false;
    else if (in_subcommands && line.size() > 2) {
      std::string name = line.substr(2, line.find(' ', 2) - 2);
      ++listed;
      bool in_table = std::any_of(commands.begin(), commands.end(), [&](const std::string& c) { return c.starts_with(name); });
      EXPECT_TRUE(in_table) << "viper " << name << " has no entry in the table";
    }
  }
  EXPECT_GE(listed, 8u) << top.out;
  for (const std::string& command : commands) {
    if (!Built(command, dir_->path())) continue;
    SCOPED_TRACE(command);
    std::map<std::string, bool> help = HelpOptions(command, dir_->path());
    EXPECT_FALSE(help.empty());
    for (const auto& [name, takes_value] : help) {
      bool in_table = std::any_of(Table().begin(), Table().end(),
                                  [&](const Option& o) { return o.command == command && o.name == name; });
      bool is_flag = Flags().count(command) && Flags().at(command).count(name);
      EXPECT_TRUE(in_table || is_flag) << "viper " << command << " " << name << " has no entry in the table";
      EXPECT_EQ(takes_value, in_table) << "viper " << command << " " << name;
    }
  }
}

// The refusal: exit 2, nothing on stdout, one line "viper COMMAND: ... NAME ... 'VALUE' ...".
void ExpectRefused(const Outcome& r, const std::string& command, const std::string& name, const std::string& value,
                   bool timed_out) {
  ASSERT_FALSE(timed_out) << "accepted: the command ran";
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  std::string top = command.substr(0, command.find(' '));
  EXPECT_TRUE(r.err.starts_with("viper " + top + ":") || r.err.starts_with("viper " + top + " ")) << r.err;
  EXPECT_NE(r.err.find(name == "-o" ? "--output" : name), std::string::npos) << "names the option: " << r.err;
  // The value, as the refusal shows it: quoted, control and non-ASCII bytes as \xNN, cut short.
  std::string shown;
  for (unsigned char c : value.substr(0, 64)) {
    if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') shown += fmt::format("\\x{:02x}", c);
    else shown += static_cast<char>(c);
  }
  shown = "'" + shown + (value.size() > 64 ? "'" : "'");
  EXPECT_NE(r.err.find(shown), std::string::npos) << "names the value " << shown << ": " << r.err;
  EXPECT_NE(r.err.find("must be"), std::string::npos) << "states the rule: " << r.err;
}

// Under a sanitizer each bad value runs an instrumented bin/viper (about 0.2 s to start and exit,
// against 0.01 s in release): all of them took 249 s of the ASan stage (2026-11-29), a quarter
// of its tests' time. There each option tries every third of its values, starting at an offset
// that moves from option to option: every option and every class of value still runs under the
// sanitizer (their checks share one validator per kind), and the release stage tries them all.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kValueStride = 3;
#else
constexpr size_t kValueStride = 1;
#endif

TEST_F(OptionChecks, EveryOptionRefusesBadValues) {
  std::map<std::string, size_t> tried;  // per class of value
  size_t total = 0, option_index = 0;
  for (const Option& o : Table()) {
    if (!Built(o.command, dir_->path())) continue;
    const std::vector<Bad> values = BadValues(o, dir_->path().string());
    for (size_t i = option_index++ % kValueStride; i < values.size(); i += kValueStride) {
      const Bad& bad = values[i];
      SCOPED_TRACE(fmt::format("viper {} {} '{}' ({})", o.command, o.name, bad.value.substr(0, 40), bad.why));
      bool timed_out = false;
      Outcome r = RunViper(Args(o.command, o.name, bad.value), dir_->path(), 10s, &timed_out);
      ExpectRefused(r, o.command, o.name, bad.value, timed_out);
      ++tried[bad.why];
      ++total;
    }
  }
  std::string counts;
  for (const auto& [why, n] : tried) counts += fmt::format(" {} {}", why, n);
  std::printf("inputs tried: %zu over %zu options:%s\n", total, Table().size(), counts.c_str());
  // Builds without the benchmarks (the sanitizer stages) have no `viper bench`: fewer options.
  EXPECT_GT(total * kValueStride, Built("bench", dir_->path()) ? 500u : 400u);
  EXPECT_EQ(tried.size(), 5u) << "every class of value: empty, negative, overlong, out-of-range, malformed";
}

// The old spellings of renamed options (named after their NodeOptions fields now) are the same
// option: listed in its help as deprecated, refused with the same rule.
TEST_F(OptionChecks, DeprecatedAliasesAreTheSameOption) {
  const std::map<std::string, std::string> aliases = {{"--keep-host", "--keep-host-versions"},
                                                      {"--keep-files", "--keep-file-versions"}};
  Outcome help = RunViper({"serve", "--help"}, dir_->path());
  for (const auto& [old_name, name] : aliases) {
    SCOPED_TRACE(old_name);
    EXPECT_NE(help.out.find("  " + name + "," + old_name + " "), std::string::npos) << help.out;
    EXPECT_NE(help.out.find(old_name + ": the old name, deprecated"), std::string::npos) << help.out;
    bool timed_out = false;
    Outcome r = RunViper({"serve", old_name, "0"}, dir_->path(), 10s, &timed_out);
    ExpectRefused(r, "serve", name, "0", timed_out);
  }
}

TEST_F(OptionChecks, FlagsRefuseValues) {
  for (const auto& [command, flags] : Flags()) {
    if (!Built(command, dir_->path())) continue;
    for (const std::string& flag : flags) {
      SCOPED_TRACE(command + " " + flag);
      auto args = Args(command, "--placeholder", "");
      args.erase(std::find(args.begin(), args.end(), "--placeholder"), std::find(args.begin(), args.end(), "--placeholder") + 2);
      args.push_back(flag + "=bogus");
      bool timed_out = false;
      Outcome r = RunViper(args, dir_->path(), 10s, &timed_out);
      ASSERT_FALSE(timed_out);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
    }
  }
}

TEST_F(OptionChecks, CommandsAreNamed) {
  Outcome bogus = RunViper({"bogus"}, dir_->path());
  EXPECT_EQ(bogus.exit_code, 2);
  EXPECT_EQ(bogus.out, "");
  EXPECT_NE(bogus.err.find("'bogus' is not a command: one of serve, "), std::string::npos) << bogus.err;
  EXPECT_EQ(std::count(bogus.err.begin(), bogus.err.end(), '\n'), 1) << bogus.err;

  Outcome none = RunViper({}, dir_->path());
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("a command is required: one of serve, "), std::string::npos) << none.err;

  Outcome overlong = RunViper({std::string(5000, 'x')}, dir_->path());
  EXPECT_EQ(overlong.exit_code, 2);
  EXPECT_LT(overlong.err.size(), 400u) << "cut short";

  Outcome unknown = RunViper({"ls", "--bogus"}, dir_->path());
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(std::count(unknown.err.begin(), unknown.err.end(), '\n'), 1) << unknown.err;
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;
}

// The instances a hostile tester found, by name.
TEST_F(OptionChecks, FoundInstances) {
  Outcome step = RunViper({"publish", "--step", "-1", "m", file_}, dir_->path());
  EXPECT_EQ(step.exit_code, 2);
  EXPECT_EQ(step.err, "viper publish: --step: '-1' must be an integer of at least 0 (decimal digits) (see viper publish --help)\n");

  bool timed_out = false;
  Outcome timeout = RunViper({"watch", "--timeout", "-5", "m"}, dir_->path(), 10s, &timed_out);
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(timeout.exit_code, 2);
  EXPECT_NE(timeout.err.find("--timeout: '-5' must be a number of seconds from 0 to 31536000"), std::string::npos) << timeout.err;

  Outcome keep = RunViper({"serve", "--keep-host-versions", "0"}, dir_->path(), 10s, &timed_out);
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(keep.exit_code, 2);
  EXPECT_NE(keep.err.find("--keep-host-versions: '0' must be an integer from 1 to 100000"), std::string::npos) << keep.err;

  Outcome address = RunViper({"serve", "--listen", "127.0.0.1:0", "--address-file", "/nonexistent/x"}, dir_->path(), 10s,
                             &timed_out);
  EXPECT_FALSE(timed_out) << "serve started although it cannot write its address file";
  EXPECT_EQ(address.exit_code, 2);
  EXPECT_NE(address.err.find("--address-file: '/nonexistent/x' must be a file path in an existing directory"),
            std::string::npos)
      << address.err;

  // The address file's directory exists but the file cannot be written there: serve stops at
  // start with one line and exit code 1, its temporary not left behind.
  Outcome unwritable = RunViper({"serve", "--listen", "127.0.0.1:0", "--segment-prefix", "vchecks",
                                 "--address-file", "/proc/viper-address"},
                                dir_->path(), 30s, &timed_out);
  EXPECT_FALSE(timed_out) << "serve kept running although it could not write its address file";
  EXPECT_EQ(unwritable.exit_code, 1) << unwritable.err;
  EXPECT_NE(unwritable.err.find("viper serve: --address-file: cannot create the temporary file /proc/viper-address.tmp."),
            std::string::npos)
      << unwritable.err;
  EXPECT_FALSE(std::filesystem::exists("/proc/viper-address.tmp"));

  // pull -o DIR: refused before anything is fetched; nothing left beside DIR.
  auto out_dir = dir_->path() / "pull_dir";
  std::filesystem::create_directories(out_dir);
  Outcome pull = RunViper({"pull", "-o", out_dir.string(), "m"}, dir_->path());
  EXPECT_EQ(pull.exit_code, 2);
  EXPECT_NE(pull.err.find("(it is a directory)"), std::string::npos) << pull.err;
  for (const auto& entry : std::filesystem::directory_iterator(dir_->path()))
    EXPECT_EQ(entry.path().filename().string().find("pull_dir.tmp"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace viper
