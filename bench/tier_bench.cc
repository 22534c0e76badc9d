// viper_tier_bench: write throughput of the host tier and the file tier against the physical
// baselines measured in the same run.
//
//   viper_tier_bench [--sizes 64MiB,600MB,1.7GB] [--reps 5] [--dir DIR] [--no-file]
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

#include "viper/file_tier.h"
#include "viper/host_tier.h"
#include "viper/snapshot.h"

namespace viper::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Config {
  std::vector<std::string> sizes = {"64MiB", "600MB", "1.7GB"};
  int reps = 5;
  std::string dir;
  bool no_file = false;
};

// "64MiB", "600MB", "1.7GB", "4096": bytes (decimal units are powers of 1000).
Result<uint64_t> ParseSize(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return Status::InvalidArgument(fmt::format("size '{}' does not start with a number", text));
  }
  static const std::map<std::string, double> kUnits = {
      {"", 1},     {"B", 1},           {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  auto unit = kUnits.find(text.substr(pos));
  if (unit == kUnits.end() || value <= 0) {
    return Status::InvalidArgument(fmt::format("size '{}': expected a positive number with B, KB, MB, GB, KiB, MiB or GiB", text));
  }
  return static_cast<uint64_t>(value * unit->second);
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
  double Best(const std::string& path) const {
    const auto& v = gbps.at(path);
    return *std::max_element(v.begin(), v.end());
  }
};

// Removes page-cache and page-table effects of one path from the next: nothing to do for
// memory; files are deleted between repetitions (outside the timed region).
void RemoveQuietly(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

// open, write() in 64 MiB chunks, fsync, close. With `early_writeback`, each chunk's writeback is
// started at once with sync_file_range (what FileTier does).
double TimeRawWrite(const fs::path& path, std::span<const std::byte> bytes, bool early_writeback) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die(Status::FromErrno("open " + path.string()));
  for (uint64_t done = 0; done < bytes.size();) {
    ssize_t w = ::write(fd, bytes.data() + done, std::min<uint64_t>(64ull << 20, bytes.size() - done));
    if (w <= 0) Die(Status::FromErrno("write " + path.string()));
    if (early_writeback) ::sync_file_range(fd, static_cast<off_t>(done), w, SYNC_FILE_RANGE_WRITE);
    done += static_cast<uint64_t>(w);
  }
  if (::fsync(fd) != 0) Die(Status::FromErrno("fsync " + path.string()));
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
  ho.prefix = fmt::format("viper-bench-{}", ::getpid());
  ho.keep_versions = 1;
  auto recycled_tier = HostTier::Open(ho);
  if (!recycled_tier.ok()) Die(recycled_tier.status());
  uint64_t rv = 1;
  TimeHostWrite(**recycled_tier, src, rv++, false);  // two fresh versions: the second retires
  TimeHostWrite(**recycled_tier, src, rv++, false);  // the first, which the pool then recycles

  FileTierOptions fo;
  fo.dir = dir;
  fo.keep_versions = 1000;  // the bench deletes old versions itself, outside the timed region
  std::unique_ptr<FileTier> file_tier;
  if (!cfg.no_file) {
    auto opened = FileTier::Open(fo);
    if (!opened.ok()) Die(opened.status());
    file_tier = std::move(*opened);
  }

  for (int rep = 0; rep < cfg.reps; ++rep) {
    auto t0 = Clock::now();
    std::memcpy(warm.data(), src.data(), src.size());
    s.Add("warm memcpy", size, Seconds(t0, Clock::now()));

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
    s.Add("host recycled", size, TimeHostWrite(**recycled_tier, src, rv++, true));

    if (file_tier) {
      const fs::path raw = dir / "raw.bin";
      s.Add("raw write+fsync", size, TimeRawWrite(raw, src, false));
      RemoveQuietly(raw);
      s.Add("raw + early wb", size, TimeRawWrite(raw, src, true));
      RemoveQuietly(raw);
      const uint64_t version = static_cast<uint64_t>(rep) + 1;
      source.Restamp(version);
      t0 = Clock::now();
      Status st = file_tier->Write("bench", version, src);
      s.Add("file tier", size, Seconds(t0, Clock::now()));
      if (!st.ok()) Die(st);
      RemoveQuietly(file_tier->PathFor("bench", version));
    }
  }

  auto row = [&](const std::string& path, const std::string& base, double target) {
    double ratio = s.Median(path) / s.Median(base);
    std::string verdict = target > 0 ? (ratio >= target ? fmt::format("meets >= {:.1f}x", target)
                                                         : fmt::format("MISSES >= {:.1f}x", target))
                                     : "";
    std::printf("| %-9s | %-15s | %6.2f | %6.2f | %-15s | %6.2f | %5.2fx | %s\n", Human(size).c_str(), path.c_str(),
                s.Median(path), s.Best(path), base.c_str(), s.Median(base), ratio, verdict.c_str());
  };
  row("host fresh", "warm memcpy", 0);
  row("fresh memcpy", "warm memcpy", 0);
  row("host recycled", "warm memcpy", 0.8);
  if (file_tier) {
    row("file tier", "raw write+fsync", 0.9);
    row("file tier", "raw + early wb", 0);
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"Host-tier and file-tier write throughput against memcpy and raw write+fsync baselines"};
  app.add_option("--sizes", cfg.sizes, "snapshot sizes (e.g. 64MiB,600MB,1.7GB)")->delimiter(',');
  app.add_option("--reps", cfg.reps, "repetitions per size (median and best are reported)")->check(CLI::Range(1, 1000));
  app.add_option("--dir", cfg.dir, "directory for the file-tier and raw-write files (default: a new temp dir)");
  app.add_flag("--no-file", cfg.no_file, "skip the file-tier rows");
  CLI11_PARSE(app, argc, argv);

  fs::path dir = cfg.dir;
  bool made_dir = false;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "viper-tier-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) Die(Status::FromErrno("mkdtemp " + tmpl));
    dir = tmpl;
    made_dir = true;
  }
  std::printf("viper_tier_bench: %d repetitions per size, interleaved; file tier in %s\n", cfg.reps, dir.c_str());
  std::printf("| size      | path            | median | best   | baseline        | median | ratio  | target\n");
  std::printf("|-----------|-----------------|--------|--------|-----------------|--------|--------|-------\n");
  for (const std::string& text : cfg.sizes) {
    auto size = ParseSize(text);
    if (!size.ok()) Die(size.status());
    RunSize(cfg, *size, dir);
  }
  std::printf("GB/s = 1e9 bytes/s; ratio = median / baseline median.\n");
  if (made_dir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return 0;
}

}  // namespace
}  // namespace viper::bench

int main(int argc, char** argv) { return viper::bench::Main(argc, argv); }
