// One size of `viper bench` (see measure.h): the floor, Viper's rows, the file + polling baseline
// and the registered per-size sections; and the notification latency over many small versions.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/measure.h"
#include "harness/section.h"
#include "viper/node.h"

namespace viper::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Status TimeFloor(const Config& c, const SourceModel& m, SizeResult& out) {
  VIPER_ASSIGN_OR_RETURN(Buffer dst, Buffer::Make(m.data_bytes, 0));
  for (int i = 0; i < c.reps + 1; ++i) {
    double t = Now(), cpu = ThreadCpuSeconds();
    std::memcpy(dst.data(), m.source.data(), m.data_bytes);
    if (i == 0) continue;
    out.memcpy_s.Add(Now() - t);
    out.memcpy_cpu_s.Add(ThreadCpuSeconds() - cpu);
  }
  for (int i = 0; i < c.reps; ++i) {
    double t = Now();
    volatile uint64_t sum = checksum64({m.source.data(), m.data_bytes});
    (void)sum;
    out.checksum_s.Add(Now() - t);
  }
  return Status::OK();
}

// Every (mode, path) with the consumer's defaults (what users get), plus, for sync, the first
// path with its checksum pass flipped: a diagnostic that isolates the cost of that pass (same
// host: verify-local adds it; remote: no-verify removes it).
Status RunCoreRows(const Config& c, const SourceModel& m, SizeResult& out) {
  std::vector<std::string> paths = c.hosts == 1 ? std::vector<std::string>{"map", "copy"} : std::vector<std::string>{"remote"};
  for (PublishMode mode : {PublishMode::kSync, PublishMode::kAsync}) {
    VIPER_ASSIGN_OR_RETURN(auto pub, StartPublisher(c, "nt3", mode));
    std::vector<std::pair<std::string, std::string>> rows;
    for (const auto& path : paths) rows.emplace_back(path, "");
    if (mode == PublishMode::kSync && c.diagnose) rows.emplace_back(paths.front(), c.hosts == 1 ? "verify-local" : "no-verify");
    // Across hosts, the same row with the producer's cut-through off (announced only once
    // committed): the publish + transfer in sequence, against the rows above in the same run.
    // Sync also times a version written in place (Begin/Commit) from its Commit, both ways.
    std::unique_ptr<Publisher> after_commit;
    if (c.hosts == 2 && c.diagnose) {
      PublisherOptions o = BenchPublisherOptions(c, "nt3", mode);
      o.cut_through = false;
      VIPER_ASSIGN_OR_RETURN(after_commit, Publisher::Start(o));
      rows.emplace_back(paths.front(), "no-cut-through");
      if (mode == PublishMode::kSync) {
        rows.emplace_back(paths.front(), "draft");
        rows.emplace_back(paths.front(), "draft-no-cut-through");
      }
    }
    for (const auto& [path, variant] : rows) {
      Publisher& publisher = variant.ends_with("no-cut-through") ? *after_commit : *pub;
      auto r = RunMode(c, publisher, m, path, variant);
      if (!r.ok()) return r.status().WithContext(out.label + " " + std::string(publish_mode_name(mode)) + " " + path);
      out.bytes = static_cast<uint64_t>(publisher.node().Latest("nt3")->size);
      out.modes.push_back(std::move(r).value());
    }
  }
  return Status::OK();
}

}  // namespace

double Samples::Percentile(double p) const {
  if (s.empty()) return 0;
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}
double Samples::mean() const {
  double sum = 0;
  for (double x : s) sum += x;
  return s.empty() ? 0 : sum / static_cast<double>(s.size());
}
double Samples::min() const { return s.empty() ? 0 : *std::min_element(s.begin(), s.end()); }
double Samples::max() const { return s.empty() ? 0 : *std::max_element(s.begin(), s.end()); }
json Samples::Json() const {
  return {{"median", median()}, {"mean", mean()}, {"p99", Percentile(99)}, {"min", min()}, {"max", max()}, {"n", s.size()}, {"samples", s}};
}

Result<SizeResult> RunSize(const Config& c, const std::string& label, uint64_t bytes, Report& report) {
  SizeResult out;
  out.label = label;
  VIPER_ASSIGN_OR_RETURN(SourceModel m, MakeNt3(bytes));
  out.tensors = m.tensors.size();
  VIPER_RETURN_IF_ERROR(TimeFloor(c, m, out));
  VIPER_RETURN_IF_ERROR(RunCoreRows(c, m, out));
  auto poll = RunPoll(c, m, label);
  if (!poll.ok()) return poll.status().WithContext(label + " file+poll baseline");
  out.poll = std::move(poll).value();
  SizeContext context{c, m, out, report};
  for (const Section& section : sections())
    if (section.per_size)
      if (Status st = section.per_size(context); !st.ok()) return st.WithContext(label + " " + section.name);
  return out;
}

Result<NotifyResult> RunNotify(const Config& c) {
  NotifyResult r;
  r.count = c.notify_count;
  std::vector<float> weights(256, 0.5f);
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {256}}, std::as_bytes(std::span<const float>(weights))}};
  VIPER_ASSIGN_OR_RETURN(auto pub, StartPublisher(c, "tiny", PublishMode::kSync));
  std::string path = c.hosts == 1 ? "map" : "remote";
  VIPER_ASSIGN_OR_RETURN(auto peer, StartPeer(c, {"subscribe", "--connect", pub->address(), "--model", "tiny", "--path", path}));
  const int warmup = 20;
  for (int i = 0; i < warmup + c.notify_count; ++i) {
    int64_t t0 = WallClockNs();
    VIPER_ASSIGN_OR_RETURN(PublishResult pr, pub->Publish(tensors, AtStep(i)));
    VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*peer, pr.version, milliseconds(30000)));
    r.bytes = pr.bytes;
    if (i < warmup) continue;
    r.notify.Add(Sec(j["completed_ns"], j["notified_ns"]));
    r.e2e.Add(Sec(t0, j["live_ns"]));
  }
  peer->Stop();
  return r;
}

}  // namespace viper::bench
