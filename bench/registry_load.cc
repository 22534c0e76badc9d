// viper_registry_load: what the Redis registry costs a fleet. Starts its own redis-server on a
// loopback port, registers N simulated nodes holding V versions each (through the real Registry,
// as RegistryAgent does), runs their heartbeats for a while, and meanwhile times new consumers
// finding a holder (a fresh connection, Lookup, NearestHoldersOfLatest). Reads Redis's own
// counters (INFO commandstats, used_memory): commands per node per second and bytes per record.
//
//   viper_registry_load --nodes 10 --versions 10,1000,10000 --seconds 6
//   viper_registry_load --nodes 1000 --versions 10 --heartbeat reput   (every record put again)
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "viper/registry.h"

namespace viper {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Options {
  int nodes = 10;
  std::vector<uint64_t> versions = {10, 1000, 10000};
  double seconds = 6;
  int ttl_ms = 3000;
  int interval_ms = 1000;
  int lookups = 200;
  std::string heartbeat = "refresh";  // or "reput": every record put again (the per-record layout)
  int port = 0;
  bool full_lookup = false;  // consumers read every holding (Lookup) instead of the newest version's
  std::string server = "redis-server";
};

// A raw connection for Redis's own counters.
class Raw {
 public:
  explicit Raw(int port) : c_(redisConnect("127.0.0.1", port)) {}
  ~Raw() { if (c_) redisFree(c_); }
  bool ok() const { return c_ && !c_->err; }
  std::string Run(const std::string& cmd) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, cmd.c_str()));
    std::string out = r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? std::string(r->str, r->len) : "";
    if (r) freeReplyObject(r);
    return out;
  }
  // Calls of every command but INFO and CONFIG (ours).
  uint64_t Calls() {
    std::istringstream in(Run("INFO commandstats"));
    uint64_t total = 0;
    for (std::string line; std::getline(in, line);) {
      if (!line.starts_with("cmdstat_") || line.starts_with("cmdstat_info") || line.starts_with("cmdstat_config")) continue;
      size_t at = line.find("calls=");
      if (at != std::string::npos) total += std::stoull(line.substr(at + 6));
    }
    return total;
  }
  uint64_t UsedMemory() {
    std::string info = Run("INFO memory");
    size_t at = info.find("used_memory:");
    return at == std::string::npos ? 0 : std::stoull(info.substr(at + 12));
  }

 private:
  redisContext* c_;
};

HolderRecord Record(int node, uint64_t version) {
  std::string address = fmt::format("10.{}.{}.{}:7000", node / 65536, (node / 256) % 256, node % 256);
  std::string host = fmt::format("host-{}", node);
  HolderRecord r;
  r.node = NodeRecordFor(fmt::format("load-{}", node), address, host, 1000 + node);
  r.info.model = "load-model";
  r.info.version = version;
  r.info.size = 1u << 30;
  r.info.checksum = 0x0123456789abcdefull ^ version;
  r.info.step = version;
  r.info.publish_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(version);
  r.info.completed_ns = r.info.publish_ns + 1000;
  r.info.metadata = {{"viper.model", r.info.model}};
  r.info.replicas = {{proto::ReplicaKind::kHostSegment, host, fmt::format("viper.{}.{}", 1000 + node, version)},
                     {proto::ReplicaKind::kNode, host, address},
                     {proto::ReplicaKind::kFile, host, fmt::format("/var/viper/load-model/{}.safetensors", version)}};
  return r;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

int RunOne(const Options& o, uint64_t versions, const std::string& url, Raw& raw) {
  raw.Run("FLUSHALL");
  uint64_t empty_memory = raw.UsedMemory();
  std::vector<std::unique_ptr<Registry>> nodes;
  std::vector<std::vector<HolderRecord>> held(o.nodes);
  auto ttl = std::chrono::milliseconds(o.ttl_ms);
  for (int n = 0; n < o.nodes; ++n) {
    auto reg = OpenRegistry(url);
    if (!reg.ok()) return fmt::print(stderr, "{}\n", reg.status().ToString()), 1;
    for (uint64_t v = 1; v <= versions; ++v) held[n].push_back(Record(n, v));
    for (size_t at = 0; at < held[n].size(); at += 1000) {
      // A TTL long enough for registering every node; the heartbeats below use `ttl`.
      auto put = (*reg)->Put(std::span(held[n]).subspan(at, std::min<size_t>(1000, held[n].size() - at)), 600s);
      if (!put.ok()) return fmt::print(stderr, "registering: {}\n", put.status().ToString()), 1;
    }
    nodes.push_back(std::move(reg).value());
  }
  uint64_t memory = raw.UsedMemory() - empty_memory;
  raw.Run("CONFIG RESETSTAT");
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lost{0}, beats{0};
  auto start = Clock::now();
  const auto beat_start = start;
  std::thread heartbeats([&] {  // each node beats once per interval, the nodes spread over it
    auto interval = std::chrono::milliseconds(o.interval_ms);
    for (uint64_t round = 0; !stop; ++round) {
      for (int n = 0; n < o.nodes && !stop; ++n) {
        std::this_thread::sleep_until(beat_start + round * interval + interval * n / o.nodes);
        if (o.heartbeat == "reput") {
          (void)nodes[n]->Put(held[n], ttl);
        } else {
          auto alive = nodes[n]->Refresh(held[n][0].node, ttl);
          if (!alive.ok() || !*alive) lost++;
        }
        beats++;
      }
    }
  });
  // Phase 1, heartbeats alone: Redis's command count is the fleet's steady cost.
  std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds)));
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t calls = raw.Calls();
  // Phase 2, new consumers looking up a holder while the heartbeats go on.
  start = Clock::now();
  std::vector<double> lookup_ms;
  size_t found_none = 0;
  auto lookup_gap = std::chrono::duration<double>(o.seconds / (o.lookups + 1));
  for (int i = 0; i < o.lookups; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(lookup_gap * (i + 1)));
    auto t0 = Clock::now();
    auto consumer = OpenRegistry(url);  // a new consumer: its own connection
    auto found = consumer.ok() ? (o.full_lookup ? (*consumer)->Lookup("load-model") : (*consumer)->LookupLatest("load-model"))
                               : Result<RegistryLookup>(consumer.status());
    auto nearest = found.ok() ? NearestHoldersOfLatest(*found, "host-3") : std::vector<HolderRecord>{};
    lookup_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    found_none += nearest.empty();
  }
  stop = true;
  heartbeats.join();
  fmt::print("| {:>5} | {:>6} | {:>9} | {:>12.2f} | {:>10.1f} | {:>10.1f} | {:>8.2f} | {:>8.2f} | {} |\n", o.nodes,
             versions, o.heartbeat, static_cast<double>(calls) / elapsed / o.nodes,
             static_cast<double>(calls) / elapsed, static_cast<double>(memory) / (o.nodes * versions),
             Percentile(lookup_ms, 0.5), Percentile(lookup_ms, 0.99),
             lost == 0 && found_none == 0 ? "ok" : fmt::format("{} lost, {} lookups empty", lost.load(), found_none));
  std::fflush(stdout);
  return lost == 0 && found_none == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"viper_registry_load: the Redis registry's cost at N nodes holding V versions each"};
  app.add_option("--nodes", o.nodes, "simulated nodes")->check(CLI::Range(1, 20000));
  app.add_option("--versions", o.versions, "versions held per node (one run each)")->delimiter(',');
  app.add_option("--seconds", o.seconds, "heartbeat phase per run")->check(CLI::Range(1.0, 600.0));
  app.add_option("--ttl-ms", o.ttl_ms, "record TTL")->check(CLI::Range(100, 600000));
  app.add_option("--interval-ms", o.interval_ms, "heartbeat interval (< TTL)")->check(CLI::Range(10, 600000));
  app.add_option("--lookups", o.lookups, "new consumers timed per run")->check(CLI::Range(1, 100000));
  app.add_option("--heartbeat", o.heartbeat, "refresh (one key per node) or reput (every record again)")
      ->check(CLI::IsMember({"refresh", "reput"}));
  app.add_flag("--full-lookup", o.full_lookup, "consumers call Lookup (every holding) instead of LookupLatest");
  app.add_option("--port", o.port, "loopback port for the redis-server (0: pick one)")->check(CLI::Range(0, 65535));
  app.add_option("--redis-server", o.server, "the redis-server binary");
  CLI11_PARSE(app, argc, argv);
  if (o.interval_ms >= o.ttl_ms) return fmt::print(stderr, "--interval-ms {} must be < --ttl-ms {}\n", o.interval_ms, o.ttl_ms), 2;
  if (o.port == 0) o.port = 20000 + getpid() % 12000;  // below the ephemeral range: no outgoing connection holds it
  pid_t server = fork();
  if (server == 0) {
    std::string port = std::to_string(o.port);
    execlp(o.server.c_str(), o.server.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--maxclients", "30000", "--loglevel", "warning", "--logfile", "/dev/null", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::unique_ptr<Raw> raw;
  for (int i = 0; i < 100 && !(raw && raw->ok()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    raw = std::make_unique<Raw>(o.port);
  }
  int rc = 0;
  if (!raw->ok()) {
    fmt::print(stderr, "{} did not start on 127.0.0.1:{}\n", o.server, o.port);
    rc = 1;
  } else {
    std::string url = fmt::format("redis://127.0.0.1:{}", o.port);
    fmt::print("redis-server on {}; heartbeat every {} ms, TTL {} ms; {} new consumers per run\n", url, o.interval_ms,
               o.ttl_ms, o.lookups);
    fmt::print("| nodes | versions | heartbeat | cmds/node/s | cmds/s total | bytes/record | lookup p50 ms | lookup p99 ms | |\n");
    fmt::print("|---|---|---|---|---|---|---|---|---|\n");
    for (uint64_t v : o.versions) rc |= RunOne(o, v, url, *raw);
  }
  raw.reset();
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  return rc;
}

}  // namespace
}  // namespace viper

int main(int argc, char** argv) { return viper::Main(argc, argv); }
