// `viper bench`: Viper's update path against the floor (warm memcpy) and the baseline users run
// today (safetensors file + fsync, consumer polling the directory), for NT3-shaped snapshots; plus
// the notification latency over many small versions. Prints a table, optionally writes JSON.
//
// --hosts 2 re-runs itself as root inside two network namespaces (scripts/hosts.sh run 2 -- hosts.sh
// exec h1 -- viper bench ... --hosts-stage 2): the producer in h1, every consumer in h2, and adds
// the raw wire measured across the same veth (TCP stream, ucx_perftest tag_bw).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "bench_child.h"
#include "bench_types.h"
#include "command.h"
#include "node_common.h"

namespace viper::cli {
namespace {

using bench::Config;
using nlohmann::json;

struct BenchFlags {
  std::string sizes = "64Mi,600M,1.7G";
  bool quick = false;
  // warmup 8: a row's first updates fault its pool's fresh segments in (1.2-6 s each at 1.7 GB),
  // and the next ~3 recycled ones still ran 1.5-1.8x slower (245-283 ms against 158 ms, no page
  // faults, a transient of the VM after gigabytes of fresh memory); with 4 warm-ups those landed
  // in the timed medians. A training job publishes hundreds of versions: the steady state counts.
  int reps = 5, warmup = 8, baseline_reps = 3, notify_count = 1000;
  double poll_interval = 1.0;
  std::string json_path, hosts_script, file_dir = "/var/tmp";
  bool no_diagnostic_rows = false;
  int hosts = 1;
  int hosts_stage = 0;
  CLI::App* app = nullptr;
};

// "64Mi", "600M", "1.7G", "1000000": decimal k M G, binary Ki Mi Gi.
Result<uint64_t> ParseSize(const std::string& text) {
  char* end = nullptr;
  double n = std::strtod(text.c_str(), &end);
  std::string unit(end);
  const std::pair<const char*, double> units[] = {{"", 1},    {"k", 1e3},         {"M", 1e6},           {"G", 1e9},
                                                  {"Ki", 1024}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}};
  for (const auto& [name, scale] : units)
    if (end != text.c_str() && n > 0 && unit == name) return static_cast<uint64_t>(n * scale);
  return Status::InvalidArgument("size '" + text + "': expected a positive number with an optional k, M, G, Ki, Mi or Gi");
}

Result<Config> MakeConfig(const BenchFlags& f) {
  Config c;
  std::stringstream ss(f.sizes);
  for (std::string item; std::getline(ss, item, ',');) {
    VIPER_ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(item));
    c.sizes.emplace_back(item, bytes);
  }
  if (c.sizes.empty()) return Status::InvalidArgument("--sizes is empty");
  bool q = f.quick;
  auto pick = [&](const char* name, int value, int quick_value) { return q && f.app->count(name) == 0 ? quick_value : value; };
  c.reps = pick("--reps", f.reps, 2);
  c.warmup = pick("--warmup", f.warmup, 2);
  c.baseline_reps = pick("--baseline-reps", f.baseline_reps, 1);
  c.notify_count = pick("--notify-count", f.notify_count, 200);
  c.poll_interval_s = f.poll_interval;
  c.quick = q;
  c.hosts = f.hosts;
  c.diagnose = !f.no_diagnostic_rows;
  if (c.reps < 1 || c.warmup < 0 || c.baseline_reps < 1 || c.notify_count < 1 || c.poll_interval_s <= 0)
    return Status::InvalidArgument("--reps, --baseline-reps, --notify-count and --poll-interval must be positive");
  c.file_dir = (std::filesystem::path(f.file_dir) / ("viper-bench-" + std::to_string(::getpid()))).string();
  c.wire_bin = (std::filesystem::path(bench::SelfExe()).parent_path() / "viper_wire_baseline").string();
  return c;
}

// ------------------------------------------------------------------ --hosts 2 staging

Result<std::string> FindHostsScript(const BenchFlags& f) {
  std::vector<std::string> candidates;
  if (!f.hosts_script.empty()) candidates.push_back(f.hosts_script);
  if (const char* env = std::getenv("VIPER_HOSTS_SCRIPT")) candidates.push_back(env);
  auto exe_dir = std::filesystem::path(bench::SelfExe()).parent_path();
  candidates.push_back((exe_dir / "../../scripts/hosts.sh").string());
  candidates.push_back("scripts/hosts.sh");
  for (const auto& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return std::filesystem::canonical(c).string();
  return Status::NotFound("scripts/hosts.sh not found (give --hosts-script)");
}

// "h1=10.77.0.1 h2=10.77.0.2" -> the address of `host`.
Result<std::string> HostAddress(const std::string& host) {
  const char* env = std::getenv("VIPER_HOSTS");
  if (!env) return Status::FailedPrecondition("VIPER_HOSTS is not set (run through scripts/hosts.sh run)");
  std::stringstream ss(env);
  for (std::string item; ss >> item;)
    if (item.starts_with(host + "=")) return item.substr(host.size() + 1);
  return Status::NotFound(host + " is not in VIPER_HOSTS=" + env);
}

std::vector<std::string> InnerArgs(const BenchFlags& f) {
  std::vector<std::string> a = {bench::SelfExe(), "bench", "--sizes", f.sizes, "--hosts", "2", "--hosts-stage", "2",
                                "--poll-interval", std::to_string(f.poll_interval), "--file-dir", f.file_dir};
  auto add = [&](const char* name, int v) {
    if (f.app->count(name)) a.insert(a.end(), {name, std::to_string(v)});
  };
  add("--reps", f.reps), add("--warmup", f.warmup), add("--baseline-reps", f.baseline_reps), add("--notify-count", f.notify_count);
  if (f.quick) a.push_back("--quick");
  if (f.no_diagnostic_rows) a.push_back("--no-diagnostic-rows");
  if (!f.json_path.empty()) a.insert(a.end(), {"--json", std::filesystem::absolute(f.json_path).string()});
  return a;
}

// Replaces this process by: hosts.sh run 2 -- hosts.sh exec h1 -- viper bench ... --hosts-stage 2.
int ExecInHosts(const BenchFlags& f) {
  if (::geteuid() != 0) return Fail("bench", Status::PermissionDenied("--hosts 2 creates network namespaces: run as root"));
  auto script = FindHostsScript(f);
  if (!script.ok()) return Fail("bench", script.status());
  std::vector<std::string> argv = {*script, "run", "2", "--", *script, "exec", "h1", "--"};
  for (auto& a : InnerArgs(f)) argv.push_back(a);
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  ::execv(raw[0], raw.data());
  return Fail("bench", Status::FromErrno("exec " + *script));
}

Status ConfigureHosts(const BenchFlags& f, Config& c) {
  VIPER_ASSIGN_OR_RETURN(std::string script, FindHostsScript(f));
  VIPER_ASSIGN_OR_RETURN(std::string h1, HostAddress("h1"));
  VIPER_ASSIGN_OR_RETURN(c.peer_ip, HostAddress("h2"));
  c.listen = h1 + ":0";
  c.consumer_prefix = {script, "exec", "h2", "--"};
  return Status::OK();
}

// ------------------------------------------------------------------ output

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }
double Gbps(uint64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }
std::string Ms(double s) { return fmt::format("{:.1f}", s * 1e3); }

// The baseline's mean latency from its measured parts: write + fsync, half a polling interval
// (the update lands at a uniformly random phase of the grid), read + parse. Its measured median
// over a few updates swings by up to one interval, so the targets compare against this.
double PollExpected(const bench::PollResult& p) { return p.stall.median() + p.interval_s / 2 + p.read.median(); }

// "map", or "map,verify-local" / "remote,no-verify" for a diagnostic row.
std::string RowPath(const bench::ModeResult& m) { return m.variant.empty() ? m.path : m.path + "," + m.variant; }

const bench::ModeResult* Find(const bench::SizeResult& s, const std::string& mode, const std::string& path) {
  for (const auto& m : s.modes)
    if (m.mode == mode && m.path == path && m.variant.empty()) return &m;
  return nullptr;
}

// What a row's transfer is held against: a receiver that verifies (every row but ",no-verify")
// against the landed + hashed TCP stream, one that does not against the landed stream.
double CeilingGbps(const bench::ModeResult& m, const bench::WireResult& w) {
  return m.variant == "no-verify" ? w.landed_gbps : w.verified_gbps;
}

void PrintSize(const bench::SizeResult& s) {
  double floor = s.memcpy_s.median();
  std::printf("\n== %s: snapshot %s (%zu NT3-like tensors)\n", s.label.c_str(), HumanBytes(static_cast<double>(s.bytes)).c_str(), s.tensors);
  std::printf("   floor: warm memcpy %s ms (%.2f GB/s); one xxh3 pass %s ms (%.2f GB/s)\n", Ms(floor).c_str(),
              Gbps(s.bytes, floor), Ms(s.checksum_s.median()).c_str(), Gbps(s.bytes, s.checksum_s.median()));
  if (s.wire.ran)
    std::printf("   wire:  TCP stream %.2f GB/s median of %zu (best %.2f, cc %s), ucx_perftest tag_bw %.2f GB/s median of %zu, "
                "with peer-failure handling (-e) %.2f GB/s (measured before and after the rows)%s%s\n", s.wire.tcp_gbps,
                s.wire.tcp_all.size(), s.wire.tcp_best_gbps, s.wire.tcp_cc.c_str(), s.wire.ucx_gbps, s.wire.ucx_all.size(),
                s.wire.ucx_peer_gbps, s.wire.error.empty() ? "" : "  ERROR: ", s.wire.error.c_str());
  if (s.wire.ran)
    std::printf("          TCP stream landed in one %s buffer %.2f GB/s (%.2fx), landed + xxh3 as it arrives %.2f GB/s (%.2fx): "
                "the verified-receive ceiling\n", HumanBytes(static_cast<double>(s.bytes)).c_str(), s.wire.landed_gbps,
                Ratio(s.wire.landed_gbps, s.wire.tcp_gbps), s.wire.verified_gbps, Ratio(s.wire.verified_gbps, s.wire.tcp_gbps));
  std::printf("   %-6s %-13s %10s %8s %8s %10s %8s %8s %8s %8s\n", "mode", "path", "e2e ms", "xmemcpy", "GB/s", "stall ms",
              "xmemcpy", "notify", "fetch", "verify");
  // Medians; "*" marks a row where some timed publish got a fresh segment (not recycled).
  // ",verify-local" / ",no-verify" rows are diagnostic: the consumer's checksum pass added or
  // removed (see SubscriberOptions::verify_local); they show what that pass costs.
  for (const auto& m : s.modes) {
    std::printf("   %-6s %-13s %10s %8.2f %8.2f %10s %8.2f %8s %8s %8s%s\n", m.mode.c_str(), RowPath(m).c_str(),
                Ms(m.e2e.median()).c_str(), Ratio(m.e2e.median(), floor), Gbps(s.bytes, m.e2e.median()),
                Ms(m.stall.median()).c_str(), Ratio(m.stall.median(), floor), Ms(m.notify.median()).c_str(),
                Ms(m.fetch.median()).c_str(), Ms(m.verify.median()).c_str(),
                m.fresh_segments ? fmt::format("  * {} fresh segment(s)", m.fresh_segments).c_str() : "");
  }
  const auto& p = s.poll;
  std::printf("   %-6s %-13s %10s %8.2f %8.2f %10s %8.2f %8s %8s %8s   (poll every %.1f s; write+fsync = stall; expected e2e %s ms)\n", "file",
              "poll", Ms(p.e2e.median()).c_str(), Ratio(p.e2e.median(), floor), Gbps(s.bytes, p.e2e.median()),
              Ms(p.stall.median()).c_str(), Ratio(p.stall.median(), floor), "-", Ms(p.read.median()).c_str(), "-",
              p.interval_s, Ms(PollExpected(p)).c_str());
  for (const auto& m : s.modes)
    if (s.wire.ran) {
      double fetch_gbps = Gbps(s.bytes, m.fetch.median());
      std::printf("   %-6s %-13s transfer (NOTIFY -> bytes here) %.2f GB/s = %.2fx TCP stream, %.2fx the %s ceiling, %.2fx ucx tag_bw; "
                  "end-to-end %.2fx TCP stream\n",
                  m.mode.c_str(), RowPath(m).c_str(), fetch_gbps, Ratio(fetch_gbps, s.wire.tcp_gbps), Ratio(fetch_gbps, CeilingGbps(m, s.wire)),
                  m.variant == "no-verify" ? "landed" : "verified", Ratio(fetch_gbps, s.wire.ucx_gbps),
                  Ratio(Gbps(s.bytes, m.e2e.median()), s.wire.tcp_gbps));
    }
}

json ModeJson(const bench::ModeResult& m, const bench::SizeResult& s) {
  double floor = s.memcpy_s.median();
  return {{"mode", m.mode}, {"path", m.path}, {"variant", m.variant}, {"e2e_s", m.e2e.Json()}, {"stall_s", m.stall.Json()},
          {"copy_s", m.copy.Json()}, {"complete_s", m.complete.Json()}, {"notify_s", m.notify.Json()},
          {"fetch_s", m.fetch.Json()}, {"verify_s", m.verify.Json()},
          {"e2e_over_memcpy", Ratio(m.e2e.median(), floor)}, {"stall_over_memcpy", Ratio(m.stall.median(), floor)},
          {"e2e_gbps", Gbps(s.bytes, m.e2e.median())}, {"fetch_gbps", Gbps(s.bytes, m.fetch.median())},
          {"speedup_vs_file_poll", Ratio(PollExpected(s.poll), m.e2e.median())},
          {"fresh_segments", m.fresh_segments},
          {"e2e_over_tcp_stream", Ratio(Gbps(s.bytes, m.e2e.median()), s.wire.tcp_gbps)},
          {"fetch_over_tcp_stream", Ratio(Gbps(s.bytes, m.fetch.median()), s.wire.tcp_gbps)},
          {"fetch_over_ucx_tag_bw", Ratio(Gbps(s.bytes, m.fetch.median()), s.wire.ucx_gbps)},
          {"fetch_over_ceiling", Ratio(Gbps(s.bytes, m.fetch.median()), CeilingGbps(m, s.wire))}};
}

json SizeJson(const bench::SizeResult& s) {
  json modes = json::array();
  for (const auto& m : s.modes) modes.push_back(ModeJson(m, s));
  json j = {{"label", s.label}, {"bytes", s.bytes}, {"tensors", s.tensors},
            {"memcpy_s", s.memcpy_s.Json()}, {"memcpy_gbps", Gbps(s.bytes, s.memcpy_s.median())},
            {"checksum_s", s.checksum_s.Json()}, {"viper", modes},
            {"file_poll", {{"e2e_s", s.poll.e2e.Json()}, {"stall_s", s.poll.stall.Json()}, {"read_s", s.poll.read.Json()},
                           {"poll_interval_s", s.poll.interval_s}, {"expected_e2e_s", PollExpected(s.poll)}, {"e2e_over_memcpy", Ratio(s.poll.e2e.median(), s.memcpy_s.median())}}}};
  if (s.wire.ran)
    j["wire"] = {{"tcp_gbps", s.wire.tcp_gbps}, {"tcp_best_gbps", s.wire.tcp_best_gbps}, {"tcp_cc", s.wire.tcp_cc},
                 {"ucx_tag_bw_gbps", s.wire.ucx_gbps}, {"tcp_all_gbps", s.wire.tcp_all},
                 {"ucx_tag_bw_peer_failure_gbps", s.wire.ucx_peer_gbps}, {"ucx_peer_failure_all_gbps", s.wire.ucx_peer_all},
                 {"landed_gbps", s.wire.landed_gbps}, {"landed_all_gbps", s.wire.landed_all},
                 {"verified_gbps", s.wire.verified_gbps}, {"verified_all_gbps", s.wire.verified_all}, {"ucx_all_gbps", s.wire.ucx_all}, {"ucx_tls", s.wire.ucx_tls}, {"error", s.wire.error}};
  return j;
}

void AddTarget(json& targets, std::string name, double value, double threshold, bool at_most) {
  bool met = at_most ? value <= threshold : value >= threshold;
  std::printf("   [%s] %s: %.3f (%s %.3f)\n", met ? " MET  " : "NOT MET", name.c_str(), value, at_most ? "<=" : ">=", threshold);
  targets.push_back({{"name", std::move(name)}, {"value", value}, {"threshold", threshold},
                     {"at_most", at_most}, {"met", met}});
}

// The targets, judged on medians; each target names the size and mode it judges.
json Targets(const Config& c, const std::vector<bench::SizeResult>& sizes, const bench::NotifyResult& n) {
  json t = json::array();
  std::printf("\n== targets\n");
  for (const auto& s : sizes) {
    double floor = s.memcpy_s.median();
    bool large = s.bytes >= 500000000;
    if (c.hosts == 1) {
      for (const char* mode : {"sync", "async"}) {
        if (auto* m = Find(s, mode, "map"))
          AddTarget(t, fmt::format("{} {} map end-to-end / warm memcpy", s.label, mode), Ratio(m->e2e.median(), floor), 1.5, true);
        if (auto* m = Find(s, mode, "map"); m && s.label == sizes.back().label)
          AddTarget(t, fmt::format("{} file+poll (expected) / {} map end-to-end", s.label, mode), Ratio(PollExpected(s.poll), m->e2e.median()), 10, false);
      }
      if (auto* m = Find(s, "async", "map"))
        AddTarget(t, fmt::format("{} async stall / warm memcpy", s.label), Ratio(m->stall.median(), floor), 1.2, true);
    } else {
      for (const char* mode : {"sync", "async"}) {
        auto* m = Find(s, mode, "remote");
        if (!m) continue;
        if (large && s.wire.tcp_gbps > 0)
          AddTarget(t, fmt::format("{} remote {} end-to-end GB/s / TCP stream GB/s", s.label, mode),
                    Ratio(Gbps(s.bytes, m->e2e.median()), s.wire.tcp_gbps), 0.85, false);
        if (large && s.wire.tcp_gbps > 0)  // the transfer alone (NOTIFY -> bytes in the consumer), for diagnosis
          AddTarget(t, fmt::format("{} remote {} transfer GB/s / TCP stream GB/s", s.label, mode),
                    Ratio(Gbps(s.bytes, m->fetch.median()), s.wire.tcp_gbps), 0.85, false);
        AddTarget(t, fmt::format("{} file+poll (expected) / remote {} end-to-end", s.label, mode), Ratio(PollExpected(s.poll), m->e2e.median()), 5, false);
      }
    }
  }
  AddTarget(t, "notification p99 (ms)", n.notify.Percentile(99) * 1e3, 1.0, true);
  return t;
}

int RunBench(const BenchFlags& f) {
  if (f.hosts != 1 && f.hosts != 2) return Fail("bench", Status::InvalidArgument("--hosts must be 1 or 2"));
  if (f.hosts == 2 && f.hosts_stage == 0) return ExecInHosts(f);
  auto config = MakeConfig(f);
  if (!config.ok()) return Fail("bench", config.status());
  Config& c = *config;
  if (c.hosts == 2)
    if (Status st = ConfigureHosts(f, c); !st.ok()) return Fail("bench", st);
  std::error_code ec;
  std::filesystem::create_directories(c.file_dir, ec);
  if (ec) return Fail("bench", Status::FromErrno("create " + c.file_dir, ec.value()));
  std::printf("viper bench: hosts %d, consumer %s, %d warm-up + %d timed updates per row (medians), file+poll %d timed, "
              "baseline files in %s\n", c.hosts, c.hosts == 1 ? "a separate process on this host" : "in namespace h2 (producer in h1)",
              c.warmup, c.reps, c.baseline_reps, f.file_dir.c_str());
  std::fflush(stdout);
  std::vector<bench::SizeResult> sizes;
  for (const auto& [label, bytes] : c.sizes) {
    bench::WireResult wire;
    if (c.hosts == 2) bench::RunWire(c, bytes, wire);  // before and after Viper's rows
    auto s = bench::RunSize(c, label, bytes);
    if (!s.ok()) return std::filesystem::remove_all(c.file_dir, ec), Fail("bench", s.status());
    if (c.hosts == 2) bench::RunWire(c, s->bytes, wire);
    s->wire = std::move(wire);
    PrintSize(*s);
    std::fflush(stdout);
    sizes.push_back(std::move(s).value());
  }
  std::filesystem::remove_all(c.file_dir, ec);
  auto n = bench::RunNotify(c);
  if (!n.ok()) return Fail("bench", n.status().WithContext("notification latency"));
  std::printf("\n== notification latency over %d versions of %s: complete -> NOTIFY p50 %.3f ms, p99 %.3f ms, max %.3f ms; "
              "publish -> live p50 %.3f ms, p99 %.3f ms\n", n->count, HumanBytes(static_cast<double>(n->bytes)).c_str(),
              n->notify.median() * 1e3, n->notify.Percentile(99) * 1e3, n->notify.max() * 1e3, n->e2e.median() * 1e3,
              n->e2e.Percentile(99) * 1e3);
  json targets = Targets(c, sizes, *n);
  if (f.json_path.empty()) return 0;
  json out = {{"hosts", c.hosts}, {"quick", c.quick}, {"warmup", c.warmup}, {"reps", c.reps},
              {"baseline_reps", c.baseline_reps}, {"nproc", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"sizes", json::array()},
              {"notification", {{"count", n->count}, {"bytes", n->bytes}, {"notify_s", n->notify.Json()}, {"e2e_s", n->e2e.Json()}}},
              {"targets", targets}};
  for (const auto& s : sizes) out["sizes"].push_back(SizeJson(s));
  std::ofstream file(f.json_path);
  file << out.dump(2) << "\n";
  if (!file) return Fail("bench", Status::FromErrno("write " + f.json_path));
  return 0;
}

ViperCommand bench_command(
    "bench", "Benchmark updates against warm memcpy and the file + polling baseline",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<BenchFlags>();
      f->app = &app;
      app.add_option("--sizes", f->sizes, "Snapshot sizes, e.g. 64Mi,600M,1.7G")->capture_default_str();
      app.add_flag("--quick", f->quick, "Fewer repetitions (2 warm-up, 2 timed, 1 baseline, 200 notifications) unless given");
      app.add_option("--reps", f->reps, "Timed updates per (mode, path)")->capture_default_str();
      app.add_option("--warmup", f->warmup, "Untimed updates first (segments and buffers fault in)")->capture_default_str();
      app.add_option("--baseline-reps", f->baseline_reps, "Timed file + poll updates per size")->capture_default_str();
      app.add_option("--notify-count", f->notify_count, "Small versions for notification percentiles")->capture_default_str();
      app.add_option("--poll-interval", f->poll_interval, "Baseline polling interval, seconds (TF Serving default 1)")->capture_default_str();
      app.add_option("--file-dir", f->file_dir, "Where baseline files go (a disk, not tmpfs)")->capture_default_str();
      app.add_flag("--no-diagnostic-rows", f->no_diagnostic_rows,
                   "Skip the diagnostic sync row whose consumer checksum pass is flipped (verify-local on one host, no-verify across hosts)");
      app.add_option("--json", f->json_path, "Also write every figure to this JSON file");
      app.add_option("--hosts", f->hosts, "1: one host; 2: producer and consumer in two network namespaces (root)")->capture_default_str();
      app.add_option("--hosts-script", f->hosts_script, "scripts/hosts.sh (default: found beside the build)");
      app.add_option("--hosts-stage", f->hosts_stage, "(internal)")->group("");
      return [f] { return RunBench(*f); };
    },
    70);

}  // namespace
}  // namespace viper::cli
