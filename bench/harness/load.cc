// `viper bench --subscribers N`: N subscriber processes on one node (the producer's host, map
// path), config.notify_count small versions published one after another; for every version and
// subscriber the notification latency (complete -> NOTIFY received, CLOCK_REALTIME stamps of one
// host), and the memory the subscribers and the node hold. The physical baselines, measured in the
// same run: the raw fan-out (a line written to each of N sleeping processes' pipes, one after
// another: what waking N processes costs this machine, without Viper), UCX's own one-way latency
// between two processes of this host (ucx_perftest tag_lat, half a round trip, busy-polling, the
// transports Viper's engine gets by default), and Viper's notification with one subscriber.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "harness/bench.h"
#include "harness/child.h"
#include "harness/measure.h"

namespace viper::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// kB fields of /proc/PID/smaps_rollup (Rss, Pss, Shared_Clean + Shared_Dirty as "Shared").
struct Memory {
  uint64_t rss_kb = 0, pss_kb = 0, shared_kb = 0;
};
Memory ReadMemory(pid_t pid) {
  Memory m;
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string key;
  std::getline(in, key);  // the "[rollup]" address line
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "Rss:") m.rss_kb = kb;
    if (key == "Pss:") m.pss_kb = kb;
    if (key == "Shared_Clean:" || key == "Shared_Dirty:") m.shared_kb += kb;
    in.ignore(256, '\n');
  }
  return m;
}

// Bytes of the node's segments in /dev/shm (names start with `prefix`).
uint64_t SegmentBytes(const std::string& prefix) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().starts_with(prefix)) bytes += e.file_size(ec);
  return bytes;
}

// ucx_perftest tag_lat between two processes of this host: the 50th percentile one-way latency, s.
Result<double> UcxOneWayLatency(const Config& c) {
  VIPER_ASSIGN_OR_RETURN(uint16_t free_port, FreeTcpPort());
  const std::string port = std::to_string(free_port);
  VIPER_ASSIGN_OR_RETURN(auto server, LineChild::Start({"ucx_perftest", "-p", port}, c.log_path));
  Result<std::string> out = Status::Unavailable("not run");
  for (int attempt = 0; attempt < 20; ++attempt) {  // the server needs a moment to listen
    std::this_thread::sleep_for(milliseconds(250));
    out = RunCapture({"ucx_perftest", "127.0.0.1", "-p", port, "-t", "tag_lat", "-s", "64", "-n", "20000"},
                     milliseconds(120000), c.log_path);
    if (out.ok()) break;
  }
  server->Stop(milliseconds(2000));
  if (!out.ok()) return out.status().WithContext("ucx_perftest tag_lat");
  std::istringstream lines(*out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("Final:")) continue;
    std::istringstream cols(line.substr(6));
    double iterations = 0, p50_us = 0;
    if (cols >> iterations >> p50_us) return p50_us / 1e6;
  }
  return Status::Corruption("ucx_perftest printed no Final row: " + out->substr(0, 400));
}

// The raw fan-out: `processes` `bench-peer wake` children sleeping in poll(2); `count` rounds (after
// 20 untimed) of one line written to each in turn; every (round, process) time from the round's
// start to the process awake, and the last process's per round.
Status MeasureFanout(const Config& c, int processes, int count, Samples& all, Samples& last) {
  std::vector<std::unique_ptr<LineChild>> peers;
  for (int i = 0; i < processes; ++i) {
    auto peer = StartPeer(c, {"wake"});
    if (!peer.ok()) return peer.status().WithContext(fmt::format("wake peer {} of {}", i + 1, processes));
    peers.push_back(std::move(peer).value());
  }
  const int warmup = 20;
  for (int i = 0; i < warmup + count; ++i) {
    int64_t t0 = WallClockNs();
    for (auto& peer : peers) VIPER_RETURN_IF_ERROR(peer->Write("\n"));
    double latest = 0;
    for (auto& peer : peers) {
      VIPER_ASSIGN_OR_RETURN(std::string line, peer->ReadLine(milliseconds(60000)));
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("woken_ns")) return Status::Corruption("wake peer printed: " + line);
      double s = Sec(t0, j["woken_ns"].get<int64_t>());
      latest = std::max(latest, s);
      if (i >= warmup) all.Add(s);
    }
    if (i >= warmup) last.Add(latest);
    std::this_thread::sleep_for(milliseconds(2));  // every peer back asleep, as between versions
  }
  for (auto& peer : peers) peer->Stop();
  return Status::OK();
}

struct LoadRun {
  Samples notify;       // complete -> NOTIFY, every (version, subscriber)
  Samples last_notify;  // complete -> NOTIFY of the last subscriber told, per version
  std::vector<Memory> peers;
  uint64_t segment_bytes = 0, version_bytes = 0;
};

// `subscribers` peers on `pub`'s model "tiny", `count` versions after 20 untimed ones.
Result<LoadRun> MeasureLoad(const Config& c, Publisher& pub, int subscribers, int count) {
  std::vector<float> weights(256, 0.5f);
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {256}}, std::as_bytes(std::span<const float>(weights))}};
  std::vector<std::unique_ptr<LineChild>> peers;
  for (int i = 0; i < subscribers; ++i) {
    auto peer = StartPeer(c, {"subscribe", "--connect", pub.address(), "--model", "tiny", "--path", "map"});
    if (!peer.ok()) return peer.status().WithContext(fmt::format("subscriber {} of {}", i + 1, subscribers));
    peers.push_back(std::move(peer).value());
  }
  LoadRun r;
  const int warmup = 20;
  for (int i = 0; i < warmup + count; ++i) {
    VIPER_ASSIGN_OR_RETURN(PublishResult pr, pub.Publish(tensors, AtStep(i)));
    r.version_bytes = pr.bytes;
    double last = 0;
    for (auto& peer : peers) {
      VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*peer, pr.version, milliseconds(60000)));
      double s = Sec(j["completed_ns"], j["notified_ns"]);
      last = std::max(last, s);
      if (i >= warmup) r.notify.Add(s);
    }
    if (i >= warmup) r.last_notify.Add(last);
  }
  for (auto& peer : peers) r.peers.push_back(ReadMemory(peer->pid()));
  r.segment_bytes = SegmentBytes(pub.options().node.segment_prefix);
  for (auto& peer : peers) peer->Stop();
  return r;
}

uint64_t MedianKb(const std::vector<Memory>& v, uint64_t Memory::*field) {
  std::vector<uint64_t> x;
  for (const auto& m : v) x.push_back(m.*field);
  std::sort(x.begin(), x.end());
  return x.empty() ? 0 : x[x.size() / 2];
}

}  // namespace

Status RunLoad(const Config& c, int subscribers, const std::string& json_path) {
  if (subscribers < 1) return Status::InvalidArgument("--subscribers must be at least 1");
  std::printf("viper bench --subscribers %d: %d subscriber processes on one node (map path), %d versions of 1 KiB, "
              "one at a time\n", subscribers, subscribers, c.notify_count);
  std::fflush(stdout);
  VIPER_ASSIGN_OR_RETURN(double ucx_s, UcxOneWayLatency(c));
  Samples fanout, fanout_last;
  VIPER_RETURN_IF_ERROR(MeasureFanout(c, subscribers, c.notify_count, fanout, fanout_last));
  VIPER_ASSIGN_OR_RETURN(auto pub, StartPublisher(c, "tiny", PublishMode::kSync));
  VIPER_ASSIGN_OR_RETURN(LoadRun one, MeasureLoad(c, *pub, 1, c.notify_count));
  Memory node_before = ReadMemory(::getpid());
  VIPER_ASSIGN_OR_RETURN(LoadRun many, MeasureLoad(c, *pub, subscribers, c.notify_count));
  Memory node_after = ReadMemory(::getpid());
  const double p99 = many.notify.Percentile(99), p99_one = one.notify.Percentile(99);
  uint64_t pss_total_kb = 0;
  for (const auto& m : many.peers) pss_total_kb += m.pss_kb;
  std::printf("   baseline: ucx_perftest tag_lat one-way (half round trip, 64 B, this host, busy-polling) p50 %.3f us\n",
              ucx_s * 1e6);
  std::printf("   baseline: raw fan-out, a pipe write to each of %d sleeping processes: woken p50 %.3f ms, p99 %.3f ms, "
              "max %.3f ms; last process of a round p50 %.3f ms, p99 %.3f ms\n", subscribers, fanout.median() * 1e3,
              fanout.Percentile(99) * 1e3, fanout.max() * 1e3, fanout_last.median() * 1e3, fanout_last.Percentile(99) * 1e3);
  std::printf("   1 subscriber:   complete -> NOTIFY p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", one.notify.median() * 1e3,
              p99_one * 1e3, one.notify.max() * 1e3);
  std::printf("   %d subscribers: complete -> NOTIFY p50 %.3f ms, p99 %.3f ms, max %.3f ms over %zu notifications; "
              "last subscriber of a version p50 %.3f ms, p99 %.3f ms\n", subscribers, many.notify.median() * 1e3,
              p99 * 1e3, many.notify.max() * 1e3, many.notify.s.size(), many.last_notify.median() * 1e3,
              many.last_notify.Percentile(99) * 1e3);
  std::printf("   ratios: p99 / raw fan-out p99 %.2f; last subscriber p99 / last process p99 %.2f; p99 with %d / with 1 "
              "subscriber %.2f; p99 / UCX one-way %.0f\n", p99 / fanout.Percentile(99),
              many.last_notify.Percentile(99) / fanout_last.Percentile(99), subscribers, p99 / p99_one, p99 / ucx_s);
  std::printf("   memory: a subscriber process RSS median %.1f MiB (PSS %.1f MiB, shared %.1f MiB); all %d PSS %.1f MiB; "
              "node process RSS %.1f -> %.1f MiB with them; node segments in /dev/shm %.1f KiB (a version is %llu B)\n",
              MedianKb(many.peers, &Memory::rss_kb) / 1024.0, MedianKb(many.peers, &Memory::pss_kb) / 1024.0,
              MedianKb(many.peers, &Memory::shared_kb) / 1024.0, subscribers, pss_total_kb / 1024.0,
              node_before.rss_kb / 1024.0, node_after.rss_kb / 1024.0, many.segment_bytes / 1024.0,
              static_cast<unsigned long long>(many.version_bytes));
  std::fflush(stdout);
  if (json_path.empty()) return Status::OK();
  json out = {{"subscribers", subscribers}, {"count", c.notify_count}, {"ucx_one_way_p50_s", ucx_s},
              {"fanout_s", fanout.Json()}, {"fanout_last_s", fanout_last.Json()},
              {"notify_one_s", one.notify.Json()}, {"notify_s", many.notify.Json()}, {"last_notify_s", many.last_notify.Json()},
              {"subscriber_rss_kb_median", MedianKb(many.peers, &Memory::rss_kb)},
              {"subscriber_pss_kb_median", MedianKb(many.peers, &Memory::pss_kb)}, {"subscribers_pss_kb_total", pss_total_kb},
              {"node_rss_kb", node_after.rss_kb}, {"node_segment_bytes", many.segment_bytes}};
  std::ofstream file(json_path);
  file << out.dump(2) << "\n";
  if (!file) return Status::FromErrno("write " + json_path);
  return Status::OK();
}

}  // namespace viper::bench
