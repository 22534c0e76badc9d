// The measurements of `viper bench` (see bench_types.h): the floor (warm memcpy, one checksum
// pass), Viper's update path per (publish mode, fetch path), the file + polling baseline, the
// notification latency and (--hosts 2) the raw wire. Every consumer is a separate process
// (`viper bench-peer`), so the figures include what a real inference server pays.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "bench_child.h"
#include "bench_types.h"
#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/snapshot.h"

namespace viper::cli::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double Sec(int64_t from_ns, int64_t to_ns) { return static_cast<double>(to_ns - from_ns) / 1e9; }

// Anonymous memory, written once so that every page is faulted in before anything is timed.
class Buffer {
 public:
  static Result<Buffer> Make(size_t size, int fill) {
    void* p = ::mmap(nullptr, std::max<size_t>(size, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Status::FromErrno("bench buffer: mmap of " + std::to_string(size) + " bytes");
    ::madvise(p, size, MADV_HUGEPAGE);
    std::memset(p, fill, size);
    Buffer b;
    b.data_ = static_cast<std::byte*>(p);
    b.size_ = size;
    return b;
  }
  Buffer() = default;
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Buffer() {
    if (data_) ::munmap(data_, std::max<size_t>(size_, 1));
  }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// A model shaped like CANDLE NT3 (two Conv1D layers, one large dense layer, two small ones), the
// large dense layer sized so that the snapshot is about `bytes`. Tensor bytes live in `source`
// (the "training process's" memory), 64-byte aligned.
struct SourceModel {
  std::vector<TensorSpec> specs;
  std::vector<TensorData> tensors;
  Buffer source;
  uint64_t data_bytes = 0;
};

constexpr int64_t kDense = 200;  // NT3's first dense layer width

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

Result<json> ReadJsonLine(LineChild& child, milliseconds timeout) {
  VIPER_ASSIGN_OR_RETURN(std::string line, child.ReadLine(timeout));
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(child.name() + " printed a non-JSON line: " + line);
  return j;
}

// Reads the consumer's lines until version `v` is live.
Result<json> WaitVersion(LineChild& child, uint64_t v, milliseconds timeout) {
  for (;;) {
    VIPER_ASSIGN_OR_RETURN(json j, ReadJsonLine(child, timeout));
    uint64_t got = j.value("version", uint64_t{0});
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

Result<std::unique_ptr<LineChild>> StartPeer(const Config& c, std::vector<std::string> args) {
  std::vector<std::string> argv = c.consumer_prefix;
  argv.push_back(SelfExe());
  argv.push_back("bench-peer");
  argv.insert(argv.end(), args.begin(), args.end());
  VIPER_ASSIGN_OR_RETURN(auto child, LineChild::Start(argv, c.log_path));
  VIPER_ASSIGN_OR_RETURN(json ready, ReadJsonLine(*child, milliseconds(30000)));
  if (!ready.value("ready", false)) return Status::Internal("consumer did not report ready: " + ready.dump());
  return child;
}

Result<std::unique_ptr<Publisher>> StartPublisher(const Config& c, const std::string& model, PublishMode mode) {
  PublisherOptions o;
  o.model = model;
  o.mode = mode;
  o.node.listen = c.listen;
  o.node.recover = false;
  o.node.segment_prefix = "viperbench" + std::to_string(::getpid());
  return Publisher::Start(o);
}

// Publishes warmup + reps versions, each after the previous one is live, and times each.
Result<ModeResult> RunMode(const Config& c, Publisher& pub, const SourceModel& m, const std::string& path,
                           const std::string& variant) {
  ModeResult r;
  r.mode = pub.options().mode == PublishMode::kSync ? "sync" : "async";
  r.path = path;
  r.variant = variant;
  std::vector<std::string> args = {"subscribe", "--connect", pub.address(), "--model", "nt3", "--path", path};
  if (!variant.empty()) args.push_back("--" + variant);
  VIPER_ASSIGN_OR_RETURN(auto peer, StartPeer(c, args));
  for (int i = 0; i < c.warmup + c.reps; ++i) {
    int64_t t0 = WallClockNs();
    VIPER_ASSIGN_OR_RETURN(PublishResult pr, pub.Publish(m.tensors, AtStep(i)));
    VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*peer, pr.version, TransferTimeout(pr.bytes)));
    if (j.value("path", "") != path) return Status::Internal("consumer loaded via " + j.value("path", "") + ", not " + path);
    if (i < c.warmup) continue;
    r.e2e.Add(Sec(t0, j["live_ns"]));
    r.stall.Add(pr.stall_ns / 1e9);
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

// ------------------------------------------------------------------ file + polling baseline

// A plain safetensors file as users write it today (contiguous tensors, no Viper metadata).
std::string SafetensorsHeader(const SourceModel& m) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : m.tensors) {
    header[t.spec.name] = {{"dtype", std::string(dtype_name(t.spec.dtype))}, {"shape", t.spec.shape},
                           {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint64_t n = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

Status WriteAll(int fd, const std::byte* p, size_t n, const std::string& what) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 64u << 20));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::FromErrno("write " + what);
    p += w, n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// tmp + fsync + rename + fsync(dir): what a careful checkpoint writer does.
Status WriteCheckpoint(const std::filesystem::path& dir, uint64_t version, const SourceModel& m, const std::string& header) {
  auto tmp = dir / (std::to_string(version) + ".safetensors.tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno("create " + tmp.string());
  Status st = WriteAll(fd, reinterpret_cast<const std::byte*>(header.data()), header.size(), tmp.string());
  for (const auto& t : m.tensors)
    if (st.ok()) st = WriteAll(fd, t.bytes.data(), t.bytes.size(), tmp.string());
  if (st.ok() && ::fsync(fd) != 0) st = Status::FromErrno("fsync " + tmp.string());
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), (dir / (std::to_string(version) + ".safetensors")).c_str()) != 0)
    st = Status::FromErrno("rename " + tmp.string());
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) ::fsync(dfd), ::close(dfd);
  return st;
}

// One untimed update first (the poller's buffer is faulted in once, as a long-running server's
// is), then reps updates each started at a random phase of the polling grid.
Result<PollResult> RunPoll(const Config& c, const SourceModel& m, const std::string& label) {
  PollResult r;
  r.interval_s = c.poll_interval_s;
  std::filesystem::path dir = std::filesystem::path(c.file_dir) / ("poll-" + label);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::FromErrno("create " + dir.string(), ec.value());
  std::string header = SafetensorsHeader(m);
  VIPER_ASSIGN_OR_RETURN(auto poller, StartPeer(c, {"poll", "--dir", dir.string(), "--interval", std::to_string(c.poll_interval_s)}));
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> phase(0, c.poll_interval_s);
  for (int i = 0; i <= c.baseline_reps; ++i) {
    uint64_t version = static_cast<uint64_t>(i) + 1;
    std::this_thread::sleep_for(std::chrono::duration<double>(phase(rng)));
    int64_t t0 = WallClockNs();
    VIPER_RETURN_IF_ERROR(WriteCheckpoint(dir, version, m, header));
    int64_t t1 = WallClockNs();
    VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*poller, version, TransferTimeout(m.data_bytes) + milliseconds(static_cast<int64_t>(3000 * c.poll_interval_s))));
    std::filesystem::remove(dir / (std::to_string(version - 1) + ".safetensors"), ec);
    if (i == 0) continue;
    r.e2e.Add(Sec(t0, j["live_ns"]));
    r.stall.Add(Sec(t0, t1));
    r.read.Add(Sec(j["found_ns"], j["live_ns"]));
  }
  poller->Stop();
  std::filesystem::remove_all(dir, ec);
  return r;
}

void TimeFloor(const Config& c, const SourceModel& m, SizeResult& out) {
  auto dst = Buffer::Make(m.data_bytes, 0);
  for (int i = 0; dst.ok() && i < c.reps + 1; ++i) {
    double t = Now();
    std::memcpy(dst->data(), m.source.data(), m.data_bytes);
    if (i > 0) out.memcpy_s.Add(Now() - t);
  }
  for (int i = 0; i < c.reps; ++i) {
    double t = Now();
    volatile uint64_t sum = checksum64({m.source.data(), m.data_bytes});
    (void)sum;
    out.checksum_s.Add(Now() - t);
  }
}

}  // namespace

double Samples::Percentile(double p) const {
  if (s.empty()) return 0;
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}
double Samples::min() const { return s.empty() ? 0 : *std::min_element(s.begin(), s.end()); }
double Samples::max() const { return s.empty() ? 0 : *std::max_element(s.begin(), s.end()); }
json Samples::Json() const {
  return {{"median", median()}, {"p99", Percentile(99)}, {"min", min()}, {"max", max()}, {"n", s.size()}, {"samples", s}};
}

Result<SizeResult> RunSize(const Config& c, const std::string& label, uint64_t bytes) {
  SizeResult out;
  out.label = label;
  VIPER_ASSIGN_OR_RETURN(SourceModel m, MakeNt3(bytes));
  out.tensors = m.tensors.size();
  TimeFloor(c, m, out);
  // Rows: every (mode, path) with the consumer's defaults (what users get), plus, for sync, the
  // first path with its checksum pass flipped: a diagnostic that isolates the cost of that pass
  // (same host: verify-local adds it; remote: no-verify removes it).
  std::vector<std::string> paths = c.hosts == 1 ? std::vector<std::string>{"map", "copy"} : std::vector<std::string>{"remote"};
  for (PublishMode mode : {PublishMode::kSync, PublishMode::kAsync}) {
    VIPER_ASSIGN_OR_RETURN(auto pub, StartPublisher(c, "nt3", mode));
    std::vector<std::pair<std::string, std::string>> rows;
    for (const auto& path : paths) rows.emplace_back(path, "");
    if (mode == PublishMode::kSync && c.diagnose) rows.emplace_back(paths.front(), c.hosts == 1 ? "verify-local" : "no-verify");
    for (const auto& [path, variant] : rows) {
      auto r = RunMode(c, *pub, m, path, variant);
      if (!r.ok()) return r.status().WithContext(label + " " + (mode == PublishMode::kSync ? "sync" : "async") + " " + path);
      out.bytes = static_cast<uint64_t>(pub->node().Latest("nt3")->size);
      out.modes.push_back(std::move(r).value());
    }
  }
  auto poll = RunPoll(c, m, label);
  if (!poll.ok()) return poll.status().WithContext(label + " file+poll baseline");
  out.poll = std::move(poll).value();
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

}  // namespace viper::cli::bench
