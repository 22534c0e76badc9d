// `viper bench` (see bench.h): runs the measurements in order and prints each size's table, the
// notification latency, the targets and (--json) every figure.
#include "harness/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "harness/measure.h"
#include "harness/section.h"
#include "viper/units.h"

namespace viper::bench {
namespace {

using nlohmann::json;

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }
double Gbps(uint64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }
std::string Ms(double s) { return fmt::format("{:.1f}", s * 1e3); }

// "map", or "map,verify-local" / "remote,no-verify" for a diagnostic row.
std::string RowPath(const ModeResult& m) { return m.variant.empty() ? m.path : m.path + "," + m.variant; }

// "0.17,0.83,0.50": where the baseline's files became visible in the poller's grid.
std::string Phases(const std::vector<double>& phases) {
  std::string out;
  for (double x : phases) out += fmt::format("{}{:.2f}", out.empty() ? "" : ",", x);
  return out;
}

const ModeResult* Find(const SizeResult& s, const std::string& mode, const std::string& path) {
  for (const auto& m : s.modes)
    if (m.mode == mode && m.path == path && m.variant.empty()) return &m;
  return nullptr;
}

// What a row's transfer is held against: a receiver that verifies (every row but ",no-verify")
// against the landed + hashed TCP stream, one that does not against the landed stream.
double CeilingGbps(const ModeResult& m, const WireResult& w) {
  return m.variant == "no-verify" ? w.landed_gbps : w.verified_gbps;
}

void PrintSize(const SizeResult& s) {
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
  std::printf("   %-6s %-13s %10s %8s %8s %10s %8s %6s %8s %8s %8s\n", "mode", "path", "e2e ms", "xmemcpy", "GB/s", "stall ms",
              "xmemcpy", "on-cpu", "notify", "fetch", "verify");
  // Medians; "*" marks a row where some timed publish got a fresh segment (not recycled).
  // ",verify-local" / ",no-verify" rows are diagnostic: the consumer's checksum pass added or
  // removed (see SubscriberOptions::verify_local); they show what that pass costs.
  // on-cpu: CPU time of the publishing thread during the stall / CPU time of the warm memcpy: on
  // a loaded machine the wall-clock stall also holds time spent waiting for a CPU.
  for (const auto& m : s.modes) {
    std::printf("   %-6s %-13s %10s %8.2f %8.2f %10s %8.2f %6.2f %8s %8s %8s%s\n", m.mode.c_str(), RowPath(m).c_str(),
                Ms(m.e2e.median()).c_str(), Ratio(m.e2e.median(), floor), Gbps(s.bytes, m.e2e.median()),
                Ms(m.stall.median()).c_str(), Ratio(m.stall.median(), floor), Ratio(m.stall_cpu.median(), s.memcpy_cpu_s.median()),
                Ms(m.notify.median()).c_str(), Ms(m.fetch.median()).c_str(), Ms(m.verify.median()).c_str(),
                m.fresh_segments ? fmt::format("  * {} fresh segment(s)", m.fresh_segments).c_str() : "");
  }
  // The baseline, measured: e2e is the mean over the grid phases (PollResult); fetch = the read.
  const auto& p = s.poll;
  std::printf("   %-6s %-13s %10s %8.2f %8.2f %10s %8.2f %6s %8s %8s %8s   (measured: polled every %.1f s, visible at grid phases %s; "
              "wait for the poll %s ms; expected %s ms)\n", "file", "poll", Ms(p.figure()).c_str(), Ratio(p.figure(), floor),
              Gbps(s.bytes, p.figure()), Ms(p.stall.median()).c_str(), Ratio(p.stall.median(), floor), "-", "-",
              Ms(p.read.median()).c_str(), "-", p.interval_s, Phases(p.phases).c_str(), Ms(p.wait.median()).c_str(),
              Ms(p.expected_e2e()).c_str());
  for (const auto& m : s.modes)
    if (s.wire.ran) {
      double fetch_gbps = Gbps(s.bytes, m.fetch.median());
      std::printf("   %-6s %-13s transfer (NOTIFY -> bytes here) %.2f GB/s = %.2fx TCP stream, %.2fx the %s ceiling, %.2fx ucx tag_bw; "
                  "end-to-end %.2fx TCP stream\n",
                  m.mode.c_str(), RowPath(m).c_str(), fetch_gbps, Ratio(fetch_gbps, s.wire.tcp_gbps), Ratio(fetch_gbps, CeilingGbps(m, s.wire)),
                  m.variant == "no-verify" ? "landed" : "verified", Ratio(fetch_gbps, s.wire.ucx_gbps),
                  Ratio(Gbps(s.bytes, m.e2e.median()), s.wire.tcp_gbps));
    }
  // Whether the machine's CPUs bound the end to end: the busy CPU-seconds of the whole machine
  // during an update, spread over every CPU, is the shortest e2e that much work allows.
  const int cpus = MachineCpus();
  const double gb = static_cast<double>(s.bytes) / 1e9;
  if (s.wire.ran) {
    std::printf("   cpu:   the machine's %d CPUs busy per GB: TCP stream %.0f ms, TCP stream landed + xxh3 %.0f ms\n", cpus,
                s.wire.tcp_cpu_s_per_gb * 1e3, s.wire.verified_cpu_s_per_gb * 1e3);
    for (const auto& m : s.modes)
      std::printf("   %-6s %-13s busy %.0f ms of CPU per update (%.0f ms per GB, %.1fx the TCP stream's): e2e >= %.0f ms on %d CPUs "
                  "(the e2e is %.2fx that floor; the CPUs were %.0f%% busy)\n",
                  m.mode.c_str(), RowPath(m).c_str(), m.machine_busy.median() * 1e3, m.machine_busy.median() / gb * 1e3,
                  Ratio(m.machine_busy.median() / gb, s.wire.tcp_cpu_s_per_gb), m.machine_busy.median() / cpus * 1e3, cpus,
                  Ratio(m.e2e.median(), m.machine_busy.median() / cpus), 100 * Ratio(m.machine_busy.median(), cpus * m.e2e.median()));
  }
}

json ModeJson(const ModeResult& m, const SizeResult& s) {
  double floor = s.memcpy_s.median();
  return {{"mode", m.mode}, {"path", m.path}, {"variant", m.variant}, {"e2e_s", m.e2e.Json()}, {"stall_s", m.stall.Json()},
          {"copy_s", m.copy.Json()}, {"complete_s", m.complete.Json()}, {"notify_s", m.notify.Json()},
          {"fetch_s", m.fetch.Json()}, {"verify_s", m.verify.Json()},
          {"e2e_over_memcpy", Ratio(m.e2e.median(), floor)}, {"stall_over_memcpy", Ratio(m.stall.median(), floor)},
          {"e2e_gbps", Gbps(s.bytes, m.e2e.median())}, {"fetch_gbps", Gbps(s.bytes, m.fetch.median())},
          {"stall_cpu_s", m.stall_cpu.Json()}, {"machine_busy_cpu_s", m.machine_busy.Json()}, {"stall_cpu_over_memcpy_cpu", Ratio(m.stall_cpu.median(), s.memcpy_cpu_s.median())},
          {"speedup_vs_file_poll", Ratio(s.poll.figure(), m.e2e.median())},
          {"speedup_vs_file_poll_expected", Ratio(s.poll.expected_e2e(), m.e2e.median())},
          {"fresh_segments", m.fresh_segments},
          {"e2e_over_tcp_stream", Ratio(Gbps(s.bytes, m.e2e.median()), s.wire.tcp_gbps)},
          {"fetch_over_tcp_stream", Ratio(Gbps(s.bytes, m.fetch.median()), s.wire.tcp_gbps)},
          {"fetch_over_ucx_tag_bw", Ratio(Gbps(s.bytes, m.fetch.median()), s.wire.ucx_gbps)},
          {"fetch_over_ceiling", Ratio(Gbps(s.bytes, m.fetch.median()), CeilingGbps(m, s.wire))}};
}

json SizeJson(const SizeResult& s) {
  json modes = json::array();
  for (const auto& m : s.modes) modes.push_back(ModeJson(m, s));
  json j = {{"label", s.label}, {"bytes", s.bytes}, {"tensors", s.tensors},
            {"memcpy_s", s.memcpy_s.Json()}, {"memcpy_cpu_s", s.memcpy_cpu_s.Json()}, {"memcpy_gbps", Gbps(s.bytes, s.memcpy_s.median())},
            {"checksum_s", s.checksum_s.Json()}, {"viper", modes},
            {"file_poll", {{"e2e_s", s.poll.e2e.Json()}, {"stall_s", s.poll.stall.Json()}, {"wait_s", s.poll.wait.Json()},
                           {"read_s", s.poll.read.Json()}, {"phases", s.poll.phases}, {"poll_interval_s", s.poll.interval_s},
                           {"expected_e2e_s", s.poll.expected_e2e()}, {"e2e_s_figure", s.poll.figure()},
                           {"e2e_over_memcpy", Ratio(s.poll.figure(), s.memcpy_s.median())}}}};
  if (s.wire.ran)
    j["wire"] = {{"tcp_gbps", s.wire.tcp_gbps}, {"tcp_best_gbps", s.wire.tcp_best_gbps},
                 {"tcp_machine_cpu_s_per_gb", s.wire.tcp_cpu_s_per_gb}, {"verified_machine_cpu_s_per_gb", s.wire.verified_cpu_s_per_gb}, {"tcp_cc", s.wire.tcp_cc},
                 {"ucx_tag_bw_gbps", s.wire.ucx_gbps}, {"tcp_all_gbps", s.wire.tcp_all},
                 {"ucx_tag_bw_peer_failure_gbps", s.wire.ucx_peer_gbps}, {"ucx_peer_failure_all_gbps", s.wire.ucx_peer_all},
                 {"landed_gbps", s.wire.landed_gbps}, {"landed_all_gbps", s.wire.landed_all},
                 {"verified_gbps", s.wire.verified_gbps}, {"verified_all_gbps", s.wire.verified_all}, {"ucx_all_gbps", s.wire.ucx_all}, {"ucx_tls", s.wire.ucx_tls}, {"error", s.wire.error}};
  return j;
}

// The targets for one size, judged on medians; each target names the size and mode it
// judges. `largest`: the last size of the run (the file + poll ratio is judged there).
void SizeTargets(const Config& c, const SizeResult& s, bool largest, Report& report) {
  double floor = s.memcpy_s.median();
  bool large = s.bytes >= 500000000;
  if (c.hosts == 1) {
    for (const char* mode : {"sync", "async"}) {
      if (auto* m = Find(s, mode, "map"))
        report.Target(fmt::format("{} {} map end-to-end / warm memcpy", s.label, mode), Ratio(m->e2e.median(), floor), 1.5, true);
      if (auto* m = Find(s, mode, "map"); m && largest)
        report.Target(fmt::format("{} file+poll / {} map end-to-end", s.label, mode), Ratio(s.poll.figure(), m->e2e.median()), 10, false);
    }
    if (auto* m = Find(s, "async", "map"))
      report.Target(fmt::format("{} async stall / warm memcpy", s.label), Ratio(m->stall.median(), floor), 1.2, true);
    return;
  }
  for (const char* mode : {"sync", "async"}) {
    auto* m = Find(s, mode, "remote");
    if (!m) continue;
    if (large && s.wire.tcp_gbps > 0)
      report.Target(fmt::format("{} remote {} end-to-end GB/s / TCP stream GB/s", s.label, mode),
                    Ratio(Gbps(s.bytes, m->e2e.median()), s.wire.tcp_gbps), 0.85, false);
    if (large && s.wire.tcp_gbps > 0)  // the transfer alone (NOTIFY -> bytes in the consumer), for diagnosis
      report.Target(fmt::format("{} remote {} transfer GB/s / TCP stream GB/s", s.label, mode),
                    Ratio(Gbps(s.bytes, m->fetch.median()), s.wire.tcp_gbps), 0.85, false);
    report.Target(fmt::format("{} file+poll / remote {} end-to-end", s.label, mode), Ratio(s.poll.figure(), m->e2e.median()), 5, false);
  }
}

void PrintNotify(const NotifyResult& n) {
  std::printf("\n== notification latency over %d versions of %s: complete -> NOTIFY p50 %.3f ms, p99 %.3f ms, max %.3f ms; "
              "publish -> live p50 %.3f ms, p99 %.3f ms\n", n.count, HumanBytes(static_cast<double>(n.bytes)).c_str(),
              n.notify.median() * 1e3, n.notify.Percentile(99) * 1e3, n.notify.max() * 1e3, n.e2e.median() * 1e3,
              n.e2e.Percentile(99) * 1e3);
}

// Every size (the wire before and after Viper's rows with --hosts 2), each printed as it completes.
Status RunSizes(const Config& c, Report& report, std::vector<SizeResult>& sizes) {
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    const auto& [label, bytes] = c.sizes[i];
    WireResult wire;
    if (c.hosts == 2) RunWire(c, bytes, wire);
    VIPER_ASSIGN_OR_RETURN(SizeResult s, RunSize(c, label, bytes, report));
    if (c.hosts == 2) RunWire(c, s.bytes, wire);
    s.wire = std::move(wire);
    PrintSize(s);
    std::fflush(stdout);
    sizes.push_back(std::move(s));
  }
  for (size_t i = 0; i < sizes.size(); ++i) SizeTargets(c, sizes[i], i + 1 == sizes.size(), report);
  return Status::OK();
}

Status WriteJson(const Config& c, const std::vector<SizeResult>& sizes, const NotifyResult& n, json sections_json,
                 json targets, const std::string& path) {
  json out = {{"hosts", c.hosts}, {"quick", c.quick}, {"warmup", c.warmup}, {"reps", c.reps},
              {"baseline_reps", c.baseline_reps}, {"nproc", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"sizes", json::array()},
              {"notification", {{"count", n.count}, {"bytes", n.bytes}, {"notify_s", n.notify.Json()}, {"e2e_s", n.e2e.Json()}}},
              {"sections", std::move(sections_json)}, {"targets", std::move(targets)}};
  for (const auto& s : sizes) out["sizes"].push_back(SizeJson(s));
  std::ofstream file(path);
  file << out.dump(2) << "\n";
  if (!file) return Status::FromErrno("write " + path);
  return Status::OK();
}

Status RunAll(const Config& c, const std::string& json_path) {
  std::sort(sections().begin(), sections().end(),
            [](const Section& a, const Section& b) { return a.order != b.order ? a.order < b.order : a.name < b.name; });
  std::printf("viper bench: hosts %d, consumer %s, %d warm-up + %d timed updates per row (medians), file+poll %d timed, "
              "baseline files in %s\n", c.hosts, c.hosts == 1 ? "a separate process on this host" : "in namespace h2 (producer in h1)",
              c.warmup, c.reps, c.baseline_reps, std::filesystem::path(c.file_dir).parent_path().c_str());
  std::fflush(stdout);
  Report report;
  std::vector<SizeResult> sizes;
  auto named = [&](const Section& s) { return std::find(c.only.begin(), c.only.end(), s.name) != c.only.end(); };
  for (const auto& name : c.only)
    if (std::none_of(sections().begin(), sections().end(), [&](const Section& s) { return s.name == name && s.once; }))
      return Status::InvalidArgument("--only " + name + ": no such part of viper bench");
  NotifyResult notify;
  if (c.only.empty()) {
    VIPER_RETURN_IF_ERROR(RunSizes(c, report, sizes));
    auto n = RunNotify(c);
    if (!n.ok()) return n.status().WithContext("notification latency");
    PrintNotify(*n);
    notify = std::move(n).value();
    report.Target("notification p99 (ms)", notify.notify.Percentile(99) * 1e3, 1.0, true);
  }
  json sections_json = json::object();
  for (const Section& section : sections())
    if (section.once && (c.only.empty() ? !section.opt_in : named(section))) {
      auto figures = section.once(c, report);
      if (!figures.ok()) return figures.status().WithContext(section.name);
      sections_json[section.name] = std::move(figures).value();
    }
  json targets = report.PrintTargets();
  if (json_path.empty()) return Status::OK();
  return WriteJson(c, sizes, notify, std::move(sections_json), std::move(targets), json_path);
}

}  // namespace

std::vector<Section>& sections() {
  static std::vector<Section> registered;
  return registered;
}

void Report::Target(std::string name, double value, double threshold, bool at_most) {
  bool met = at_most ? value <= threshold : value >= threshold;
  targets_.push_back({{"name", std::move(name)}, {"value", value}, {"threshold", threshold}, {"at_most", at_most}, {"met", met}});
}

json Report::PrintTargets() const {
  std::printf("\n== targets\n");
  for (const auto& t : targets_)
    std::printf("   [%s] %s: %.3f (%s %.3f)\n", t["met"].get<bool>() ? " MET  " : "NOT MET", t["name"].get<std::string>().c_str(),
                t["value"].get<double>(), t["at_most"].get<bool>() ? "<=" : ">=", t["threshold"].get<double>());
  return targets_;
}

Status Run(const Config& c, const std::string& json_path) {
  std::error_code ec;
  std::filesystem::create_directories(c.file_dir, ec);
  if (ec) return Status::FromErrno("create " + c.file_dir, ec.value());
  Status st = RunAll(c, json_path);
  std::filesystem::remove_all(c.file_dir, ec);
  return st;
}

}  // namespace viper::bench
