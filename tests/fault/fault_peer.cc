// viper_fault_peer: the producer and consumer processes of the fault and load tests. They run
// until SIGTERM (a clean stop) or SIGKILL (a fault), and leave what a test needs to judge them in
// files that survive a kill.
//
//   produce --model M --listen HOST:PORT --address-file F [--store-dir D] [--segment-prefix P]
//           [--mode sync|async] [--interval-ms T] [--min-bytes A] [--max-bytes B] [--seed S]
//           [--versions N] [--keep-files K] [--log L] [--state-file S] [--nonce random|version]
//           [--registry URL] [--registry-ttl-ms T]
//       Publishes versions (zero-copy Begin/Commit) every T ms, version v's large tensor of a size
//       drawn from [A, B] by (S, pid, n), every byte of tensor i set to Pattern(v, i) but the nonce
//       tensor's, which holds a number drawn at start (random) or v itself (version). Appends "v 0" to L when Commit returns. With N > 0 it stops after N versions, waits until they are announced
//       and flushed, and writes "published N" to S. With --registry its node registers what it holds
//       there (records of TTL T ms, put again every T/3 ms).
//   consume --model M --connect HOST:PORT --status F [--path auto|map|copy|remote|file]
//           [--threads K] [--live-log L] [--until V] [--min-reads R] [--file-dir D] [--pause-us P]
//           [--timeout-s T] [--nonce random|version]
//       K threads read the live version in a loop and check every read themselves
//       (tests/fault/content.h; with --nonce version the nonce tensor
//       must hold the version too), pausing P us between reads. F holds a JSON summary, rewritten every 100 ms and at once after
//       an error. L gets "version checksum" per version made live. With V > 0 it exits once every thread
//       has seen version >= V and read R times; after T seconds without that, exits 3 with the
//       subscriber's last error.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fault/content.h"
#include "viper/log.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

using namespace viper;

namespace {

using Flags = std::map<std::string, std::string>;
std::atomic<bool> g_stop{false};

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "fault_peer: expected --flag, got %s\n", argv[i]);
      std::exit(2);
    }
    flags[argv[i] + 2] = argv[i + 1];
  }
  return flags;
}

std::string Get(const Flags& f, const std::string& k, const std::string& def = "") {
  auto it = f.find(k);
  return it == f.end() ? def : it->second;
}
uint64_t GetU64(const Flags& f, const std::string& k, uint64_t def) {
  auto it = f.find(k);
  return it == f.end() ? def : std::stoull(it->second);
}

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "fault_peer: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// --nonce random (default) or version.
bool NonceIsVersion(const Flags& f) {
  std::string nonce = Get(f, "nonce", "random");
  if (nonce != "random" && nonce != "version") Die("nonce", Status::InvalidArgument("--nonce is random or version, not " + nonce));
  return nonce == "version";
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

// "version checksum", appended with a single write(2): complete in the file once it returns, even if the
// process is killed right after.
void AppendLine(int fd, uint64_t version, uint64_t checksum) {
  std::string line = std::to_string(version) + " " + checksum_hex(checksum) + "\n";
  if (fd >= 0 && ::write(fd, line.data(), line.size()) < 0) std::perror("fault_peer: append");
}

// SIGTERM/SIGINT end the run cleanly (destructors unlink segments); blocked in every thread and
// taken by this one.
void StartSignalThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    sigwait(&set, &sig);
    g_stop = true;
  }).detach();
}

void SleepUnlessStopped(std::chrono::milliseconds total) {
  auto until = std::chrono::steady_clock::now() + total;
  while (!g_stop && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

uint64_t SizeOf(uint64_t seed, uint64_t n, uint64_t min_bytes, uint64_t max_bytes) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + n * 0xBF58476D1CE4E5B9ull;  // splitmix64 of (seed, n)
  x ^= x >> 30, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 27, x *= 0x94D049BB133111EBull, x ^= x >> 31;
  return max_bytes > min_bytes ? min_bytes + x % (max_bytes - min_bytes + 1) : min_bytes;
}

int Produce(const Flags& f) {
  PublisherOptions options;
  options.model = Get(f, "model", "fm");
  options.node.listen = Get(f, "listen", "127.0.0.1:0");
  options.node.store_dir = Get(f, "store-dir");
  options.node.segment_prefix = Get(f, "segment-prefix", "viper");
  options.node.keep_file_versions = GetU64(f, "keep-files", 1000000);
  options.node.registry = Get(f, "registry");  // a shared registry the node registers in, e.g. redis://...
  if (const uint64_t ttl_ms = GetU64(f, "registry-ttl-ms", 0); ttl_ms > 0) {
    options.node.registry_heartbeat.ttl = std::chrono::milliseconds(ttl_ms);
    options.node.registry_heartbeat.interval = std::chrono::milliseconds(ttl_ms / 3);
  }
  auto mode = ParsePublishMode(Get(f, "mode", "sync"));
  if (!mode.ok()) Die("mode", mode.status());
  options.mode = *mode;
  const auto interval = std::chrono::milliseconds(GetU64(f, "interval-ms", 20));
  const uint64_t min_bytes = GetU64(f, "min-bytes", 16 << 10), max_bytes = GetU64(f, "max-bytes", 1 << 20);
  const uint64_t seed = GetU64(f, "seed", 1), versions = GetU64(f, "versions", 0);
  const std::string log_path = Get(f, "log");
  int log_fd = log_path.empty() ? -1 : ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

  auto pub = Publisher::Start(options);
  if (!pub.ok()) Die("start", pub.status());
  WriteFileAtomic(Get(f, "address-file"), (*pub)->address() + "\n");
  const uint64_t nonce = std::random_device()() * 0x100000001ull ^ static_cast<uint64_t>(::getpid());
  const bool nonce_is_version = NonceIsVersion(f);
  auto latest = (*pub)->node().Latest(options.model);  // after a restart: what the store recovered
  uint64_t next = latest ? latest->version + 1 : 1;
  for (uint64_t n = 0; !g_stop && (versions == 0 || n < versions); ++n) {
    auto specs = testing::FaultModelSpecs(SizeOf(seed ^ static_cast<uint64_t>(::getpid()), n, min_bytes, max_bytes));
    auto draft = (*pub)->Begin(specs);
    if (!draft.ok()) Die("begin", draft.status());
    const uint64_t v = next++;  // Commit numbers it; only this producer publishes on its node
    for (size_t i = 0; i < specs.size(); ++i) {
      auto bytes = draft->tensor(specs[i].name);
      if (specs[i].name == testing::kNonceTensor) {
        std::memcpy(bytes.data(), nonce_is_version ? &v : &nonce, std::min(bytes.size(), sizeof(nonce)));
        continue;
      }
      std::memset(bytes.data(), testing::Pattern(v, i), bytes.size());
    }
    PublishInfo info;
    info.step = v;
    auto r = (*pub)->Commit(std::move(draft).value(), info);
    if (!r.ok()) Die("commit", r.status());
    if (r->version != v) Die("commit", Status::Internal("filled as version " + std::to_string(v) + ", numbered " +
                                                        std::to_string(r->version)));
    AppendLine(log_fd, r->version, 0);  // the checksum is sealed later in async mode: not known here
    SleepUnlessStopped(interval);
  }
  if (Status st = (*pub)->Wait(); !st.ok()) Die("wait", st);
  if (Status st = (*pub)->node().WaitFlushed(); !st.ok()) Die("flush", st);
  if (!Get(f, "state-file").empty()) WriteFileAtomic(Get(f, "state-file"), "published " + std::to_string(versions) + "\n");
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pub->reset();
  return 0;
}

struct ReadStats {
  std::atomic<uint64_t> reads{0}, errors{0}, regressions{0}, newest{0};
  // The fewest distinct versions one reader read (lowered as each reader ends; max before).
  std::atomic<uint64_t> fewest_versions_per_reader{UINT64_MAX};
  std::mutex mu;
  std::string first_error;
};

void WriteStatus(const std::string& path, ReadStats& stats, Subscriber& sub) {
  auto live = sub.latest();
  auto s = sub.stats();
  const uint64_t fewest = stats.fewest_versions_per_reader.load();
  nlohmann::json j;
  {
    std::lock_guard<std::mutex> lock(stats.mu);
    j = {{"pid", ::getpid()},
         {"reads", stats.reads.load()},
         {"errors", stats.errors.load()},
         {"first_error", stats.first_error},
         {"regressions", stats.regressions.load()},
         {"newest_read", stats.newest.load()},
         {"fewest_versions_per_reader", fewest == UINT64_MAX ? 0 : fewest},
         {"live", live ? live->version() : 0},
         {"updates", s.updates},
         {"fetch_failures", s.fetch_failures}};
  }
  WriteFileAtomic(path, j.dump() + "\n");
}

// One reader: takes the live version, checks all of it, drops it; never goes back in versions.
void ReadLoop(Subscriber& sub, const std::string& model, bool nonce_is_version, ReadStats& stats,
              const std::string& status_path, uint64_t until, uint64_t min_reads, std::chrono::microseconds pause,
              std::chrono::steady_clock::time_point deadline) {
  uint64_t last = 0, mine = 0, versions = 0;
  struct Done {  // records this reader's distinct versions however the loop ends
    ReadStats& stats;
    const uint64_t& versions;
    ~Done() {
      uint64_t fewest = stats.fewest_versions_per_reader.load();
      while (versions < fewest && !stats.fewest_versions_per_reader.compare_exchange_weak(fewest, versions)) {
      }
    }
  } done{stats, versions};
  while (!g_stop && std::chrono::steady_clock::now() < deadline) {
    std::shared_ptr<const ModelVersion> mv = sub.latest();  // held for the whole "inference"
    if (!mv) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::string error = testing::CheckContent(mv->snapshot, model, mv->version(), nonce_is_version);
    stats.reads++, mine++;
    if (mv->version() < last) stats.regressions++;
    if (mv->version() != last) versions++;
    last = mv->version();
    uint64_t seen = stats.newest.load();
    while (last > seen && !stats.newest.compare_exchange_weak(seen, last)) {
    }
    if (!error.empty()) {
      stats.errors++;
      {
        std::lock_guard<std::mutex> lock(stats.mu);
        if (stats.first_error.empty())
          stats.first_error = "version " + std::to_string(mv->version()) + " (via " +
                              std::string(fetch_path_name(mv->path)) + ": " + mv->reason + "): " + error;
      }
      WriteStatus(status_path, stats, sub);  // before anything can kill us
    }
    if (until > 0 && last >= until && mine >= min_reads) return;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
}

int Consume(const Flags& f) {
  SubscriberOptions options;
  options.model = Get(f, "model", "fm");
  options.connect = Get(f, "connect");
  options.file_dir = Get(f, "file-dir");
  auto path = ParseFetchPath(Get(f, "path", "auto"));
  if (!path.ok()) Die("path", path.status());
  options.path = *path;
  const std::string status_path = Get(f, "status");
  const uint64_t threads = GetU64(f, "threads", 2), until = GetU64(f, "until", 0), min_reads = GetU64(f, "min-reads", 0);
  const std::chrono::microseconds pause(GetU64(f, "pause-us", 0));
  const uint64_t timeout_s = GetU64(f, "timeout-s", 0);
  const bool nonce_is_version = NonceIsVersion(f);
  const auto deadline = timeout_s == 0 ? std::chrono::steady_clock::time_point::max()
                                       : std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) Die("subscribe", sub.status());
  const std::string live_log = Get(f, "live-log");
  int live_fd = live_log.empty() ? -1 : ::open(live_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  (*sub)->OnUpdate([live_fd](const std::shared_ptr<const ModelVersion>& mv) {
    AppendLine(live_fd, mv->version(), mv->snapshot.declared_checksum().value_or(0));
  });

  ReadStats stats;
  std::vector<std::thread> readers;
  for (uint64_t t = 0; t < threads; ++t)
    readers.emplace_back([&] { ReadLoop(**sub, options.model, nonce_is_version, stats, status_path, until, min_reads, pause, deadline); });
  std::atomic<bool> readers_done{false};
  std::thread status([&] {
    while (!readers_done) {
      WriteStatus(status_path, stats, **sub);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  for (auto& t : readers) t.join();
  readers_done = true;
  status.join();
  WriteStatus(status_path, stats, **sub);
  if (until > 0 && stats.newest.load() < until) {
    std::fprintf(stderr, "fault_peer: version %llu not reached in %llu s; last error: %s\n",
                 static_cast<unsigned long long>(until), static_cast<unsigned long long>(timeout_s),
                 (*sub)->last_error().ToString().c_str());
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: viper_fault_peer produce|consume --flag value ...\n");
    return 2;
  }
  StartSignalThread();
  Flags flags = ParseFlags(argc, argv);
  std::string cmd = argv[1];
  if (cmd == "produce") return Produce(flags);
  if (cmd == "consume") return Consume(flags);
  std::fprintf(stderr, "fault_peer: unknown command %s\n", cmd.c_str());
  return 2;
}
