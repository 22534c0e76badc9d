// viper_stall_probe: where a publish's stall goes beyond one warm memcpy (docs/BENCHMARKS.md,
// "Async publish stall: where the time goes"). Not built by default (no CI time):
//
//   cmake --build build --target viper_stall_probe && build/bin/viper_stall_probe 600000000 9
//
// Times, interleaved and repeated, the pieces a Publish() is made of against memcpy: the copy in
// 2 MiB chunks with streaming stores (as the publisher does), into private and shared memory, with
// the hash thread following it (hash_follower.h), and an async Publisher::Publish itself; each
// with wall time, the calling thread's CPU time and its context switches (involuntary: preempted;
// voluntary: it waited for something), so that a slow copy is told apart from a loaded machine.
// Then the 4K-aliasing scan: StreamingCopy and memcpy by (destination - source) mod 4096.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "hash_follower.h"
#include "viper/publisher.h"

namespace {

using namespace viper;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double Cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
rusage Usage() {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  return r;
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::byte* Anonymous(size_t n, bool huge) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(p, 0x3c, n);
  return static_cast<std::byte*>(p);
}

// A /dev/shm mapping as the host tier makes one (fallocate + populate), unlinked at once.
std::byte* Shared(size_t n) {
  std::string name = "/viper-stall-probe." + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || posix_fallocate(fd, 0, static_cast<off_t>(n)) != 0) std::abort();
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  shm_unlink(name.c_str());
  close(fd);
  if (p == MAP_FAILED) std::abort();
  PrefaultForWrite(p, n);
  memset(p, 0, n);
  return static_cast<std::byte*>(p);
}

constexpr size_t kChunk = 2 << 20;  // the publisher's copy chunk
void ChunkedCopy(std::byte* d, const std::byte* s, size_t n, internal::HashFollower* follower) {
  for (size_t at = 0; at < n; at += kChunk) {
    size_t k = std::min(kChunk, n - at);
    StreamingCopy({d + at, k}, {s + at, k});
    if (follower) follower->Advance(at + k);
  }
}

struct Stats {
  std::vector<double> wall, cpu, involuntary, voluntary;
};

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::stoull(argv[1]) : 600000000;
  const int reps = argc > 2 ? std::stoi(argv[2]) : 7;
  const size_t m = n - 8192;  // room to offset the destination
  std::byte* src = Anonymous(n, true);
  std::byte* private_dst = Anonymous(n, true);
  std::byte* shared_dst = Shared(n);
  PublisherOptions options;
  options.model = "probe";
  options.mode = PublishMode::kAsync;
  options.node.recover = false;
  options.node.segment_prefix = "viper-stall-probe" + std::to_string(getpid());
  auto publisher = Publisher::Start(options);
  if (!publisher.ok()) {
    std::fprintf(stderr, "viper_stall_probe: %s\n", publisher.status().ToString().c_str());
    return 1;
  }
  std::vector<TensorData> tensors = {{{"w", DType::kU8, {static_cast<int64_t>(m)}}, {src, m}}};
  for (int i = 0; i < 6; ++i) {  // the pool's segments exist and are recycled from here on
    if (!(*publisher)->Publish(tensors, {}).ok() || !(*publisher)->Wait().ok()) return 1;
  }
  std::map<std::string, std::vector<double>> extra;
  auto with_follower = [&](std::byte* dst) {
    internal::HashFollower follower(m, {{0, {src, m}}});
    double hash_cpu = 0;
    std::thread hasher([&] {
      double c = Cpu();
      follower.Run();
      hash_cpu = Cpu() - c;
    });
    ChunkedCopy(dst, src, m, &follower);
    double t = Now();
    follower.result().wait();
    extra["  of which waiting for the hash thread"].push_back(Now() - t);
    hasher.join();
    extra["  the hash thread's CPU"].push_back(hash_cpu);
  };
  // +1024: source and destination at different offsets in their pages (see the aliasing scan).
  const std::vector<std::pair<std::string, std::function<void()>>> variants = {
      {"memcpy private -> private (the floor)", [&] { memcpy(private_dst, src, m); }},
      {"memcpy private -> shared", [&] { memcpy(shared_dst + 1024, src, m); }},
      {"chunked StreamingCopy -> shared", [&] { ChunkedCopy(shared_dst + 1024, src, m, nullptr); }},
      {"chunked StreamingCopy -> shared + hash", [&] { with_follower(shared_dst + 1024); }},
      {"xxh3 of the source alone", [&] { volatile uint64_t h = checksum64({src, m}); (void)h; }},
      {"Publisher::Publish (async)", [&] {
         auto r = (*publisher)->Publish(tensors, {});
         if (!r.ok() || !(*publisher)->Wait().ok()) std::abort();
       }},
  };
  std::map<std::string, Stats> stats;
  for (int r = 0; r < reps; ++r) {
    for (const auto& [name, run] : variants) {
      rusage u0 = Usage();
      double t0 = Now(), c0 = Cpu();
      run();
      rusage u1 = Usage();
      Stats& s = stats[name];
      s.wall.push_back(Now() - t0);
      s.cpu.push_back(Cpu() - c0);
      s.involuntary.push_back(static_cast<double>(u1.ru_nivcsw - u0.ru_nivcsw));
      s.voluntary.push_back(static_cast<double>(u1.ru_nvcsw - u0.ru_nvcsw));
    }
  }
  const Stats& floor = stats[variants.front().first];
  std::printf("viper_stall_probe: %zu bytes, %d interleaved repetitions, medians; x = / the floor's\n", m, reps);
  for (const auto& [name, run] : variants) {
    const Stats& s = stats[name];
    std::printf("%-40s wall %7.1f ms (x%.2f)  on CPU %7.1f ms (x%.2f)  context switches: involuntary %3.0f, voluntary %3.0f\n",
                name.c_str(), Median(s.wall) * 1e3, Median(s.wall) / Median(floor.wall), Median(s.cpu) * 1e3,
                Median(s.cpu) / Median(floor.cpu), Median(s.involuntary), Median(s.voluntary));
  }
  for (const auto& [name, v] : extra) std::printf("%-40s %7.1f ms\n", name.c_str(), Median(v) * 1e3);

  std::printf("\n4K aliasing: on-CPU time by (destination - source) mod 4096, x = / memcpy at offset 0\n");
  std::vector<double> base;
  for (int r = 0; r < reps; ++r) {
    double c = Cpu();
    memcpy(private_dst, src, m);
    base.push_back(Cpu() - c);
  }
  for (size_t delta : {0, 64, 128, 256, 512, 1024, 2048}) {
    std::vector<double> stream, plain;
    for (int r = 0; r < reps; ++r) {
      double c = Cpu();
      StreamingCopy({private_dst + delta, m}, {src, m});
      stream.push_back(Cpu() - c);
      c = Cpu();
      memcpy(private_dst + delta, src, m);
      plain.push_back(Cpu() - c);
    }
    std::printf("  offset %4zu: StreamingCopy x%.2f, memcpy x%.2f\n", delta, Median(stream) / Median(base), Median(plain) / Median(base));
  }
  return 0;
}
