// viper_tier_bench: write throughput of the host tier and the file tier against the physical
// baselines measured in the same run.
//
//   viper_tier_bench [--sizes 64MiB,600MB,1.7GB] [--reps 5] [--dir DIR] [--no-file] [--samples]
//
// For each snapshot size, every repetition runs, interleaved (so that drift hits all alike):
//   warm memcpy        memcpy into an already-faulted buffer (baseline of the host rows)
//   fresh memcpy       memcpy into freshly allocated anonymous memory (context: page faults)
//   host fresh         HostTier Allocate (new segment: shm_open, ftruncate, fallocate, mmap)
//                      + memcpy into it + Commit
//   host recycled      Allocate (a retired segment, already faulted) + memcpy + Commit
//   raw write+fsync    open, write() 64 MiB chunks, fsync, close (baseline of the file row)
//   raw + early wb     the same with sync_file_range(WRITE) after each chunk, as the tier does
//                      (context: the physical best of this write pattern)
//   file tier          FileTier::Write: tmp file, write() from the caller's buffer, fsync,
//                      rename, directory fsync; the snapshot is already in memory
//   raw no fsync,      the same two without any fsync (FileTierOptions::fsync = false): the
//   tier no fsync      tier's code path against a plain write(), free of the device's variance
// Disk steps run in an order rotated every repetition; every written file is deleted and the file
// system synced (outside the timed region) before the next step.
//
//   viper_tier_bench --many 40000     (instead of the sizes)
// A tier holding many small versions, one model each, as a sample cache's node does: the time of
// each Allocate + 64-byte copy + Commit of a new model, for the first and the last 1,000 of N,
// against the raw syscalls that make one such segment (shm_open O_EXCL, ftruncate, fallocate,
// mmap, close) timed in the same run; then every segment is dropped at once.
// The source is a sealed snapshot in a pre-faulted buffer. Each figure is GB/s (1e9 bytes/s);
// the table shows the median and the best of the repetitions; ratios are median/median.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "store/file_tier.h"
#include "store/host_tier.h"
#include "viper/snapshot.h"
#include "viper/units.h"

namespace viper::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Config {
  std::vector<std::string> sizes = {"64MiB", "600MB", "1.7GB"};
  int reps = 5;
  std::string dir;
  bool no_file = false;
  bool samples = false;
  int settle_ms = 0;
  uint64_t many = 0;  // --many N: the many-small-versions part only
};

Config g_cfg;

// "64MiB", "600MB", "1.7GB", "4096" (viper/units.h), more than zero.
Result<uint64_t> ParseSize(const std::string& text) {
  VIPER_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(text, "size"));
  if (bytes == 0) return Status::InvalidArgument(fmt::format("size '{}' must be more than 0 bytes", text));
  return bytes;
}

std::string Human(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1000000000) return fmt::format("{:.2f} GB", bytes / 1e9);
  return fmt::format("{:.0f} MB", bytes / 1e6);
}

// A sealed snapshot of `total` bytes (one U8 tensor filling what the header leaves). Restamp()
// changes its version (header only: the data and its checksum stay).
struct Source {
  SnapshotLayout layout;
  VersionStamp stamp;
  std::vector<std::byte> bytes;

  explicit Source(uint64_t total) {
    uint64_t header = SnapshotLayout::Make({{"w", DType::kU8, {1}}}).value().data_offset();
    layout = SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(total - header)}}}).value();
    bytes.resize(layout.total_bytes());
    auto* w = reinterpret_cast<uint64_t*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / 8; ++i) w[i] = i * 0x9E3779B97F4A7C15ull;
    stamp.model = "bench";
    stamp.version = 1;
    if (!layout.Seal(bytes, &stamp).ok()) std::abort();
  }
  void Restamp(uint64_t version) {
    stamp.version = version;
    if (!layout.WriteHeader(bytes, stamp).ok()) std::abort();
  }
};

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void Die(const Status& st) {
  std::fprintf(stderr, "viper_tier_bench: %s\n", st.ToString().c_str());
  std::exit(1);
}

// Collected GB/s per path.
struct Samples {
  std::map<std::string, std::vector<double>> gbps;
  void Add(const std::string& path, uint64_t bytes, double seconds) { gbps[path].push_back(bytes / seconds / 1e9); }
  double Median(const std::string& path) const {
    auto v = gbps.at(path);
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  // Median over repetitions of path[i] / base[i] (same repetition: adjacent in time).
  double PairedRatio(const std::string& path, const std::string& base) const {
    const auto& a = gbps.at(path);
    const auto& b = gbps.at(base);
    std::vector<double> r;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / b[i]);
    std::sort(r.begin(), r.end());
    return r.size() % 2 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
  }
  double Best(const std::string& path) const {
    const auto& v = gbps.at(path);
    return *std::max_element(v.begin(), v.end());
  }
};

// Deletes a file written by a timed step and flushes the file system (outside the timed region),
// so that the next timed write does not pay for this one's block freeing (the root file system
// here is mounted with `discard`: the journal commit after a big unlink carries the TRIMs, and
// the next fsync would wait for it).
void RemoveQuietly(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  int fd = ::open(p.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
  if (g_cfg.settle_ms > 0) ::usleep(static_cast<useconds_t>(g_cfg.settle_ms) * 1000);
}

// open, write() in 64 MiB chunks, fsync, close. With `early_writeback`, each chunk's writeback is
// started at once with sync_file_range (what FileTier does).
double TimeRawWrite(const fs::path& path, std::span<const std::byte> bytes, bool early_writeback, bool sync = true) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die(Status::FromErrno("open " + path.string()));
  for (uint64_t done = 0; done < bytes.size();) {
    ssize_t w = ::write(fd, bytes.data() + done, std::min<uint64_t>(64ull << 20, bytes.size() - done));
    if (w <= 0) Die(Status::FromErrno("write " + path.string()));
    if (early_writeback) ::sync_file_range(fd, static_cast<off_t>(done), w, SYNC_FILE_RANGE_WRITE);
    done += static_cast<uint64_t>(w);
  }
  if (sync && ::fsync(fd) != 0) Die(Status::FromErrno("fsync " + path.string()));
  ::close(fd);
  return Seconds(t0, Clock::now());
}

double TimeHostWrite(HostTier& tier, std::span<const std::byte> src, uint64_t version, bool expect_recycled) {
  auto t0 = Clock::now();
  auto lease = tier.Allocate(src.size());
  if (!lease.ok()) Die(lease.status());
  std::memcpy(lease->data().data(), src.data(), src.size());
  bool recycled = lease->recycled();
  Status st = tier.Commit(std::move(*lease), "bench", version);
  double s = Seconds(t0, Clock::now());
  if (!st.ok()) Die(st);
  if (recycled != expect_recycled) {
    Die(Status::Internal(fmt::format("expected a {} segment", expect_recycled ? "recycled" : "fresh")));
  }
  return s;
}

void RunSize(const Config& cfg, uint64_t size, const fs::path& dir) {
  Source source(size);
  std::span<const std::byte> src = source.bytes;
  std::vector<std::byte> warm(src.size());
  std::memset(warm.data(), 0, warm.size());  // fault it in once
  Samples s;

  HostTierOptions ho;
  ho.prefix = "viper-bench";  // the pid is in each segment name; a crashed run is cleaned by the next
  ho.keep_versions = 1;
  auto recycled_tier = HostTier::Open(ho);
  if (!recycled_tier.ok()) Die(recycled_tier.status());
  uint64_t rv = 1;
  TimeHostWrite(**recycled_tier, src, rv++, false);  // two fresh versions: the second retires
  TimeHostWrite(**recycled_tier, src, rv++, false);  // the first, which the pool then recycles

  // Two file tiers: the real one (fsync) and one with fsync off, whose figure against a raw
  // write without fsync isolates the tier's own code path from the device's large variance.
  std::unique_ptr<FileTier> file_tier, nosync_tier;
  if (!cfg.no_file) {
    for (bool sync : {true, false}) {
      FileTierOptions fo;
      fo.dir = sync ? dir : dir / "nosync";
      fo.fsync = sync;
      fo.keep_versions = 1000;  // the bench deletes old versions itself, outside the timed region
      auto opened = FileTier::Open(fo);
      if (!opened.ok()) Die(opened.status());
      std::error_code ec;
      fs::create_directories(fo.dir / "bench", ec);  // the raw baselines write beside the tier's files
      (sync ? file_tier : nosync_tier) = std::move(*opened);
    }
  }
  auto tier_write = [&](FileTier& tier, uint64_t version) {
    source.Restamp(version);
    auto t0 = Clock::now();
    Status st = tier.Write("bench", version, src);
    double seconds = Seconds(t0, Clock::now());
    if (!st.ok()) Die(st);
    RemoveQuietly(tier.PathFor("bench", version));
    return seconds;
  };
  auto raw_write = [&](const fs::path& raw, bool early, bool sync) {
    double seconds = TimeRawWrite(raw, src, early, sync);
    RemoveQuietly(raw);
    return seconds;
  };

  for (int rep = 0; rep < cfg.reps; ++rep) {
    auto t0 = Clock::now();
    std::memcpy(warm.data(), src.data(), src.size());
    s.Add("warm memcpy", size, Seconds(t0, Clock::now()));
    s.Add("host recycled", size, TimeHostWrite(**recycled_tier, src, rv++, true));
    {
      t0 = Clock::now();
      void* fresh = ::mmap(nullptr, src.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (fresh == MAP_FAILED) Die(Status::FromErrno("mmap"));
      std::memcpy(fresh, src.data(), src.size());
      s.Add("fresh memcpy", size, Seconds(t0, Clock::now()));
      ::munmap(fresh, src.size());
    }
    {
      HostTierOptions fresh_opts = ho;
      fresh_opts.prefix += "-fresh";
      auto tier = HostTier::Open(fresh_opts);
      if (!tier.ok()) Die(tier.status());
      s.Add("host fresh", size, TimeHostWrite(**tier, src, 1, false));
    }  // destroyed (unlinked) outside the timed region
    if (!file_tier) continue;

    const uint64_t version = static_cast<uint64_t>(rep) + 1;
    const fs::path raw = dir / "bench" / "raw.bin";
    const fs::path raw_nosync = dir / "nosync" / "bench" / "raw.bin";
    // The disk steps in a rotating order, so that no path always follows the same one.
    std::vector<std::function<void()>> steps = {
        [&] { s.Add("raw write+fsync", size, raw_write(raw, false, true)); },
        [&] { s.Add("raw + early wb", size, raw_write(raw, true, true)); },
        [&] { s.Add("file tier", size, tier_write(*file_tier, version)); },
    };
    for (size_t i = 0; i < steps.size(); ++i) steps[(i + rep) % steps.size()]();
    s.Add("raw no fsync", size, raw_write(raw_nosync, false, false));
    s.Add("tier no fsync", size, tier_write(*nosync_tier, version));
  }

  auto row = [&](const std::string& path, const std::string& base, double target) {
    double ratio = s.Median(path) / s.Median(base);
    std::string verdict = target > 0 ? (ratio >= target ? fmt::format("meets >= {:.1f}x", target)
                                                         : fmt::format("MISSES >= {:.1f}x", target))
                                     : "";
    std::printf("| %-9s | %-15s | %6.2f | %6.2f | %-15s | %6.2f | %5.2fx | %5.2fx | %s\n", Human(size).c_str(),
                path.c_str(), s.Median(path), s.Best(path), base.c_str(), s.Median(base), ratio,
                s.PairedRatio(path, base), verdict.c_str());
  };
  if (cfg.samples) {
    for (const auto& [path, v] : s.gbps) {
      std::string line;
      for (double x : v) line += fmt::format(" {:.2f}", x);
      std::printf("  %-9s %-16s:%s\n", Human(size).c_str(), path.c_str(), line.c_str());
    }
  }
  row("host fresh", "warm memcpy", 0);
  row("fresh memcpy", "warm memcpy", 0);
  row("host recycled", "warm memcpy", 0.8);
  if (file_tier) {
    row("file tier", "raw write+fsync", 0.9);
    row("file tier", "raw + early wb", 0);
    row("tier no fsync", "raw no fsync", 0);
  }
  std::fflush(stdout);
}

// Median of the per-operation times in [begin, end) of `t` (seconds).
double MedianOf(std::vector<double> t, size_t begin, size_t end) {
  std::vector<double> part(t.begin() + static_cast<std::ptrdiff_t>(begin), t.begin() + static_cast<std::ptrdiff_t>(end));
  std::nth_element(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(part.size() / 2), part.end());
  return part[part.size() / 2];
}

void RunMany(uint64_t n) {
  constexpr size_t kWindow = 1000;
  if (n < 2 * kWindow) Die(Status::InvalidArgument(fmt::format("--many {}: give at least {}", n, 2 * kWindow)));
  HostTierOptions ho;
  ho.prefix = "viper-bench";
  ho.keep_versions = 1;
  ho.max_models = n + 1;
  auto tier = HostTier::Open(ho);
  if (!tier.ok()) Die(tier.status());
  std::byte sample[64] = {};
  std::vector<double> tier_s, raw_s;
  tier_s.reserve(n);
  raw_s.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    auto lease = (*tier)->Allocate(sizeof sample);
    if (!lease.ok()) Die(lease.status().WithContext(fmt::format("version {} of {}", i + 1, n)));
    std::memcpy(lease->data().data(), sample, sizeof sample);
    Status st = (*tier)->Commit(std::move(*lease), fmt::format("s{}", i), 1);
    tier_s.push_back(Seconds(t0, Clock::now()));
    if (!st.ok()) Die(st);
  }
  // The raw baseline, as many segments again (the map count allowing: they are unmapped as made).
  const long page = ::sysconf(_SC_PAGESIZE);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string name = fmt::format("/viper-bench-raw.{}.{}", ::getpid(), i);
    auto t0 = Clock::now();
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) Die(Status::FromErrno("shm_open " + name));
    if (::ftruncate(fd, 2 * page) != 0 || ::posix_fallocate(fd, 0, page) != 0) Die(Status::FromErrno("ftruncate " + name));
    void* p = ::mmap(nullptr, static_cast<size_t>(2 * page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) Die(Status::FromErrno("mmap " + name));
    ::close(fd);
    std::memcpy(p, sample, sizeof sample);
    raw_s.push_back(Seconds(t0, Clock::now()));
    ::munmap(p, static_cast<size_t>(2 * page));
    ::shm_unlink(name.c_str());
  }
  const double first = MedianOf(tier_s, 0, kWindow), last = MedianOf(tier_s, n - kWindow, n);
  const double raw = MedianOf(raw_s, 0, n);
  std::printf("many small versions: %llu models of one 64-byte version each in one host tier\n",
              static_cast<unsigned long long>(n));
  std::printf("  Allocate + copy + Commit, median of the first %zu: %.1f us; of the last %zu: %.1f us (last / first %.2fx)\n",
              kWindow, first * 1e6, kWindow, last * 1e6, last / first);
  std::printf("  baseline, same run: shm_open + ftruncate + fallocate + mmap + close of one segment: %.1f us (median of %llu)\n",
              raw * 1e6, static_cast<unsigned long long>(n));
  std::printf("  last 1,000 / baseline: %.2fx\n", last / raw);
  tier->reset();
}

int Main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"Host-tier and file-tier write throughput against memcpy and raw write+fsync baselines"};
  app.add_option("--sizes", cfg.sizes, "snapshot sizes (e.g. 64MiB,600MB,1.7GB)")->delimiter(',');
  app.add_option("--reps", cfg.reps, "repetitions per size (median and best are reported)")->check(CLI::Range(1, 1000));
  app.add_option("--dir", cfg.dir, "directory for the file-tier and raw-write files (default: a new temp dir)");
  app.add_flag("--no-file", cfg.no_file, "skip the file-tier rows");
  app.add_option("--settle-ms", cfg.settle_ms, "pause after deleting each written file (lets the disk finish discards)");
  app.add_flag("--samples", cfg.samples, "also print every repetition's GB/s, in run order");
  app.add_option("--many", cfg.many, "instead of the sizes: N one-version models of 64 bytes in one tier (a sample cache's node)")
      ->check(CLI::Range(uint64_t{2000}, uint64_t{10000000}));
  CLI11_PARSE(app, argc, argv);
  g_cfg = cfg;
  if (cfg.many != 0) {
    RunMany(cfg.many);
    return 0;
  }

  fs::path dir = cfg.dir;
  bool made_dir = false;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "viper-tier-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) Die(Status::FromErrno("mkdtemp " + tmpl));
    dir = tmpl;
    made_dir = true;
  }
  std::printf("viper_tier_bench: %d repetitions per size, interleaved; file tier in %s\n", cfg.reps, dir.c_str());
  std::printf("| size      | path            | median | best   | baseline        | median | ratio  | paired | target\n");
  std::printf("|-----------|-----------------|--------|--------|-----------------|--------|--------|--------|-------\n");
  for (const std::string& text : cfg.sizes) {
    auto size = ParseSize(text);
    if (!size.ok()) Die(size.status());
    RunSize(cfg, *size, dir);
  }
  std::printf("GB/s = 1e9 bytes/s; ratio = median / baseline median; paired = median over repetitions of\n"
              "(path / baseline) measured in the same repetition. The target verdict uses ratio.\n");
  if (made_dir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return 0;
}

}  // namespace
}  // namespace viper::bench

int main(int argc, char** argv) { return viper::bench::Main(argc, argv); }
