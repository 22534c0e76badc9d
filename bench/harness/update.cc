// The pieces of every update row (see update.h).
#include "harness/update.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "viper/node.h"

namespace viper::bench {

using nlohmann::json;
using std::chrono::milliseconds;

double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double MachineBusyCpuSeconds() {
  // The aggregate "cpu" line, in clock ticks: user nice system idle iowait irq softirq steal.
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return 0;
  unsigned long long t[8] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &t[0], &t[1], &t[2], &t[3], &t[4], &t[5],
                            &t[6], &t[7]);
  std::fclose(f);
  if (n != 8) return 0;
  return static_cast<double>(t[0] + t[1] + t[2] + t[5] + t[6] + t[7]) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

int MachineCpus() { return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))); }

Result<Buffer> Buffer::Make(size_t size, int fill) {
  void* p = ::mmap(nullptr, std::max<size_t>(size, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("bench buffer: mmap of " + std::to_string(size) + " bytes");
  ::madvise(p, size, MADV_HUGEPAGE);
  std::memset(p, fill, size);
  Buffer b;
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = size;
  return b;
}

Buffer::Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

Buffer::~Buffer() {
  if (data_) ::munmap(data_, std::max<size_t>(size_, 1));
}

namespace {

constexpr int64_t kDense = 200;  // NT3's first dense layer width

Result<json> ReadJsonLine(LineChild& child, milliseconds timeout) {
  VIPER_ASSIGN_OR_RETURN(std::string line, child.ReadLine(timeout));
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(child.name() + " printed a non-JSON line: " + line);
  return j;
}

}  // namespace

Result<SourceModel> MakeNt3(uint64_t bytes) {
  std::vector<TensorSpec> fixed = {
      {"conv1.weight", DType::kF32, {128, 1, 20}}, {"conv1.bias", DType::kF32, {128}},
      {"conv2.weight", DType::kF32, {128, 128, 10}}, {"conv2.bias", DType::kF32, {128}},
      {"dense1.weight", DType::kF32, {kDense, 1}},   {"dense1.bias", DType::kF32, {kDense}},
      {"dense2.weight", DType::kF32, {20, kDense}},  {"dense2.bias", DType::kF32, {20}},
      {"out.weight", DType::kF32, {2, 20}},          {"out.bias", DType::kF32, {2}}};
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout probe, SnapshotLayout::Make(fixed));
  if (bytes < probe.total_bytes() + 1000000)
    return Status::InvalidArgument("snapshot size " + std::to_string(bytes) + " is too small: at least " +
                                   std::to_string(probe.total_bytes() + 1000000) + " bytes");
  // The smallest dense layer that reaches `bytes` (alignment padding may add a few bytes more).
  fixed[4].shape[1] = static_cast<int64_t>((bytes - probe.total_bytes() + kDense * 4 - 1) / (kDense * 4)) + 1;
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout, SnapshotLayout::Make(fixed));
  SourceModel m;
  m.specs = fixed;
  m.data_bytes = layout.data_bytes();
  VIPER_ASSIGN_OR_RETURN(m.source, Buffer::Make(layout.data_bytes(), 0x3c));
  for (const TensorInfo& t : layout.tensors()) {
    const TensorSpec* spec = nullptr;
    for (const auto& s : m.specs) spec = s.name == t.name ? &s : spec;
    m.tensors.push_back({*spec, std::span<const std::byte>(m.source.data() + t.begin, t.nbytes())});
  }
  return m;
}

Result<json> WaitVersion(LineChild& child, uint64_t v, milliseconds timeout, const std::function<void(const json&)>& other) {
  for (;;) {
    VIPER_ASSIGN_OR_RETURN(json j, ReadJsonLine(child, timeout));
    uint64_t got = j.value("version", uint64_t{0});
    if (got == 0 && other) other(j);
    if (got == v) return j;
    if (got > v) return Status::Internal("consumer went from below version " + std::to_string(v) + " to " + std::to_string(got));
  }
}

PublishInfo AtStep(int i) {
  PublishInfo info;
  info.step = static_cast<uint64_t>(i);
  return info;
}

milliseconds TransferTimeout(uint64_t bytes) { return milliseconds(60000 + bytes / 50000); }  // >= 50 MB/s

Result<std::unique_ptr<LineChild>> StartPeer(const Config& c, std::vector<std::string> args, json* ready_line) {
  std::vector<std::string> argv = c.consumer_prefix;
  argv.push_back(SelfExe());
  argv.push_back("bench-peer");
  argv.insert(argv.end(), args.begin(), args.end());
  VIPER_ASSIGN_OR_RETURN(auto child, LineChild::Start(argv, c.log_path));
  VIPER_ASSIGN_OR_RETURN(json ready, ReadJsonLine(*child, milliseconds(30000)));
  if (!ready.value("ready", false)) return Status::Internal("consumer did not report ready: " + ready.dump());
  if (ready_line != nullptr) *ready_line = std::move(ready);
  return child;
}

Result<std::unique_ptr<Publisher>> StartPublisher(const Config& c, const std::string& model, PublishMode mode,
                                                  DeltaMode delta) {
  return Publisher::Start(BenchPublisherOptions(c, model, mode, delta));
}

PublisherOptions BenchPublisherOptions(const Config& c, const std::string& model, PublishMode mode, DeltaMode delta) {
  PublisherOptions o;
  o.node.delta = delta;
  o.model = model;
  o.mode = mode;
  o.node.listen = c.listen;
  o.node.insecure = true;  // --hosts listens on a namespace address, reachable only inside the bench's own namespaces
  o.node.recover = false;
  o.node.segment_prefix = "viperbench" + std::to_string(::getpid());
  return o;
}

Result<ModeResult> RunMode(const Config& c, Publisher& pub, const SourceModel& m, const std::string& path,
                           const std::string& variant) {
  ModeResult r;
  r.mode = publish_mode_name(pub.options().mode);
  r.path = path;
  r.variant = variant;
  // "draft...": the version is written in place (Begin, each tensor copied into the draft as a
  // training step would write it) and timed from Commit. These and "no-cut-through" are the
  // producer's variants; the others are the consumer's flags.
  const bool draft = variant.rfind("draft", 0) == 0;
  std::vector<std::string> args = {"subscribe", "--connect", pub.address(), "--model", "nt3", "--path", path};
  if (!variant.empty() && variant != "no-cut-through" && !draft) args.push_back("--" + variant);
  VIPER_ASSIGN_OR_RETURN(auto peer, StartPeer(c, args));
  std::vector<TensorSpec> specs;
  for (const auto& t : m.tensors) specs.push_back(t.spec);
  for (int i = 0; i < c.warmup + c.reps; ++i) {
    std::optional<Draft> written;
    if (draft) {
      VIPER_ASSIGN_OR_RETURN(written, pub.Begin(specs));
      for (const auto& t : m.tensors) std::memcpy(written->tensor(t.spec.name).data(), t.bytes.data(), t.bytes.size());
    }
    int64_t t0 = WallClockNs();
    double cpu0 = ThreadCpuSeconds(), busy0 = MachineBusyCpuSeconds();
    VIPER_ASSIGN_OR_RETURN(PublishResult pr, draft ? pub.Commit(std::move(*written), AtStep(i)) : pub.Publish(m.tensors, AtStep(i)));
    double cpu = ThreadCpuSeconds() - cpu0;
    VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*peer, pr.version, TransferTimeout(pr.bytes)));
    double busy = MachineBusyCpuSeconds() - busy0;
    if (j.value("path", "") != path) return Status::Internal("consumer loaded via " + j.value("path", "") + ", not " + path);
    if (i < c.warmup) continue;
    r.e2e.Add(Sec(t0, j["live_ns"]));
    r.stall.Add(pr.stall_ns / 1e9);
    r.stall_cpu.Add(cpu);
    r.machine_busy.Add(busy);
    r.fresh_segments += pr.recycled ? 0 : 1;
    r.copy.Add(pr.copy_ns / 1e9);
    r.complete.Add(Sec(t0, j["completed_ns"]));
    r.notify.Add(Sec(j["completed_ns"], j["notified_ns"]));
    r.fetch.Add(Sec(j["notified_ns"], j["fetched_ns"]));
    r.verify.Add(Sec(j["fetched_ns"], j["verified_ns"]));
  }
  VIPER_RETURN_IF_ERROR(pub.Wait());
  peer->Stop();
  return r;
}

}  // namespace viper::bench
