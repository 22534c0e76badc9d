// `viper bench --gpu` (bench/harness/gpu.h).
#include "harness/gpu.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "harness/measure.h"
#include "viper/gpu.h"
#include "viper/gpu_publisher.h"
#include "viper/gpu_store.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

extern char** environ;

namespace viper::bench {
namespace {

using namespace viper::gpu;

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Times `work` (queued on s) with events: milliseconds, median of reps.
template <typename F>
Result<double> TimeOnStream(const Stream& s, int device, int reps, F work) {
  VIPER_ASSIGN_OR_RETURN(Event a, Event::Create(device, true));
  VIPER_ASSIGN_OR_RETURN(Event b, Event::Create(device, true));
  std::vector<double> ms;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    VIPER_RETURN_IF_ERROR(a.Record(s));
    VIPER_RETURN_IF_ERROR(work());
    VIPER_RETURN_IF_ERROR(b.Record(s));
    VIPER_RETURN_IF_ERROR(b.Synchronize());
    VIPER_ASSIGN_OR_RETURN(float t, Event::ElapsedMs(a, b));
    if (r > 0) ms.push_back(t);
  }
  return Median(ms);
}

class PeerProcess {
 public:
  Status Start(const std::string& bin, int device, bool in_place) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string dev = std::to_string(device);
    std::vector<char*> argv = {const_cast<char*>(bin.c_str()), const_cast<char*>("--device"), dev.data()};
    if (in_place) argv.push_back(const_cast<char*>("--in-place"));
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = ::fdopen(out[0], "r");
    if (rc != 0) return Status::FromErrno("spawn " + bin, rc);
    std::string ready = Line();
    if (ready.rfind("READY ", 0) != 0) return Status::Unavailable("GPU consumer process: " + ready);
    return Status::OK();
  }
  ~PeerProcess() {
    if (to_ >= 0) {
      char q = 'Q';
      (void)!::write(to_, &q, 1);
      ::close(to_);
    }
    if (from_) std::fclose(from_);
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
  }
  std::string Line() {
    char buf[2048];
    if (!from_ || !std::fgets(buf, sizeof buf, from_)) return "EOF (the consumer process ended)";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // Sends v; returns the consumer's copy-complete time (CLOCK_MONOTONIC ns) and its copy's ms.
  Result<std::pair<int64_t, double>> Copy(const GpuVersion& v) {
    std::string m = "V" + EncodeGpuVersion(v);
    if (::write(to_, m.data(), m.size()) != static_cast<ssize_t>(m.size())) return Status::FromErrno("write to consumer");
    std::string r = Line();
    long long version = 0, done = 0, us = 0;
    if (std::sscanf(r.c_str(), "OK %lld %lld %lld", &version, &done, &us) != 3)
      return Status::Internal("GPU consumer process: " + r);
    return std::make_pair(static_cast<int64_t>(done), us / 1000.0);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

// viper_gpu_subscriber (a Subscriber with gpu_device, beside viper_gpu_peer) over pipes, one line
// per command ("W <version>" -> "OK <version> <in_place> <bytes> <publish_to_live_us> ...").
class SubscriberProcess {
 public:
  // extra: more viper_gpu_subscriber arguments (--early, --path remote).
  Status Start(const std::string& bin, const std::string& connect, const std::string& model, bool in_place,
               std::vector<std::string> extra) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<std::string> args = {bin, "--connect", connect, "--model", model};
    args.insert(args.end(), extra.begin(), extra.end());
    if (in_place) args.push_back("--in-place");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = ::fdopen(out[0], "r");
    if (rc != 0) return Status::FromErrno("spawn " + bin, rc);
    if (std::string ready = Line(); ready != "READY") return Status::Unavailable("GPU subscriber process: " + ready);
    return Status::OK();
  }
  ~SubscriberProcess() {
    if (to_ >= 0) ::close(to_);  // EOF ends it
    if (from_) std::fclose(from_);
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
  }
  std::string Line() {
    char buf[4096];
    if (!from_ || !std::fgets(buf, sizeof buf, from_)) return "EOF (the subscriber process ended)";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string Command(const std::string& c) {
    std::string m = c + "\n";
    if (::write(to_, m.data(), m.size()) != static_cast<ssize_t>(m.size())) return "ERR write to the subscriber failed";
    return Line();
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

struct Row {
  double dtod_ms = 0, staging_ms = 0, live_ms = 0, live_sealed_ms = 0, sealed_ms = 0, consumer_copy_ms = 0;
  double step_ms = 0, step_with_publish_ms = 0, stall_ms = 0, publish_call_ms = 0;
  double live_in_place_ms = 0;
  double host_live_ms = 0;  // publish -> a subscriber without a GPU has the version (host path)
  std::string host_error;
  // Through the node with SubscriberOptions::gpu_early (the device-only NOTIFY): a Subscriber
  // process on this host, copying into its own buffer / reading in place.
  double node_early_ms = 0, node_early_in_place_ms = 0;
  std::string node_early_error;
  // The staged path (GPU -> pinned -> network engine -> host -> GPU): a Subscriber process with
  // gpu_device on the network path, publish -> live on its GPU.
  double staged_ms = 0;
  std::string staged_how, staged_error;
  // The staged path's network stage alone: one loopback TCP stream of the model's bytes, landed and
  // hashed as a subscriber verifies what crossed the network (viper_wire_baseline --verify).
  double wire_ms = 0;
  std::string wire_error;
  std::string live_error;  // why publish -> live in another process was not measured
};

// Publish -> live in a viper_gpu_subscriber process (a Subscriber with gpu_device, beside
// viper_gpu_peer; `args` its options), as it stamps it (CLOCK_REALTIME, the producer's publish time
// from the announcement), through a GpuPublisher of its own with `max_buffers`: the median of
// `timed` publishes after `max_buffers` warm-ups (every buffer used once), in ms, and how the last one reached the subscriber's GPU (the
// rest of its OK line), which must start with `want_how`. The host path runs to completion between
// publishes, so each starts quiet.
Result<std::pair<double, std::string>> LiveInSubscriberProcess(const GpuConfig& c, const std::vector<DeviceTensor>& tensors,
                                                               const Stream& train, const std::string& model,
                                                               size_t max_buffers, std::vector<std::string> args,
                                                               bool in_place, int timed, std::string_view want_how) {
  std::string bin = (std::filesystem::path(c.peer_bin).parent_path() / "viper_gpu_subscriber").string();
  if (::access(bin.c_str(), X_OK) != 0) return Status::NotFound(bin + " not found (it is built with the tests)");
  PublisherOptions po;
  po.model = model;
  po.node.segment_prefix = "viper-" + model;
  VIPER_ASSIGN_OR_RETURN(auto pub, Publisher::Start(po));
  DeviceVersionStore::Options go;
  go.device = c.device;
  go.max_buffers = max_buffers;
  VIPER_ASSIGN_OR_RETURN(auto gp, GpuPublisher::Start(pub.get(), go));
  SubscriberProcess sub;
  VIPER_RETURN_IF_ERROR(sub.Start(bin, pub->address(), po.model, in_place, std::move(args)));
  std::vector<double> lat;
  std::string how;
  const int warmups = static_cast<int>(max_buffers);
  for (int r = 0; r < timed + warmups; ++r) {
    VIPER_ASSIGN_OR_RETURN(uint64_t v, gp->PublishDevice(tensors, train));
    std::string reply = sub.Command("W " + std::to_string(v));
    long long got = 0, ip = 0, nbytes = 0, us = 0;
    int how_at = 0;
    if (std::sscanf(reply.c_str(), "OK %lld %lld %lld %lld %n", &got, &ip, &nbytes, &us, &how_at) != 4 ||
        got != static_cast<long long>(v) || how_at == 0)
      return Status::Internal("GPU subscriber: " + reply);
    how = reply.substr(static_cast<size_t>(how_at));
    if (!how.starts_with(want_how)) return Status::Internal("not delivered as \"" + std::string(want_how) + "\": " + reply);
    if (r >= warmups) lat.push_back(us / 1000.0);
    (void)sub.Command("D " + std::to_string(v));
    VIPER_RETURN_IF_ERROR(gp->WaitHost(v, std::chrono::seconds(60)));
  }
  return std::make_pair(Median(lat), how);
}

Result<Row> MeasureSize(const GpuConfig& c, uint64_t bytes) {
  const int dev = c.device;
  Row row;
  VIPER_ASSIGN_OR_RETURN(Stream train, Stream::Create(dev));
  // The model: 32 tensors (a few layers' worth), filled with random bytes (never zeros).
  const int kTensors = 32;
  uint64_t per = (bytes / kTensors) & ~uint64_t(255);
  VIPER_ASSIGN_OR_RETURN(DeviceBuffer model, DeviceBuffer::Allocate(dev, per * kTensors));
  {
    const uint64_t chunk = 64ull << 20;
    VIPER_ASSIGN_OR_RETURN(PinnedBuffer rnd, PinnedBuffer::Allocate(dev, chunk));
    std::mt19937_64 rng(42);
    for (uint64_t i = 0; i + 8 <= chunk; i += 8) {
      uint64_t x = rng();
      std::memcpy(rnd.data() + i, &x, 8);
    }
    for (uint64_t off = 0; off < model.size(); off += chunk)
      VIPER_RETURN_IF_ERROR(CopyHostToDevice(model.ptr() + off, rnd.data(), std::min(chunk, model.size() - off), train));
    VIPER_RETURN_IF_ERROR(train.Synchronize());
  }
  const uint64_t n = model.size();
  std::vector<DeviceTensor> tensors;
  for (int i = 0; i < kTensors; ++i)
    tensors.push_back(DeviceTensor{TensorSpec{"layer" + std::to_string(i), DType::kBF16, {int64_t(per / 2)}},
                                   model.ptr() + per * i});

  // 1. The floor: one device-to-device copy of the model.
  {
    VIPER_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(dev, n));
    VIPER_ASSIGN_OR_RETURN(row.dtod_ms, TimeOnStream(train, dev, c.reps, [&] {
      return CopyDeviceToDevice(dst.ptr(), model.ptr(), n, train);
    }));
    // 2. Staging without Viper: GPU -> pinned host -> GPU.
    VIPER_ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Allocate(dev, n));
    VIPER_ASSIGN_OR_RETURN(row.staging_ms, TimeOnStream(train, dev, std::max(1, c.reps / 2), [&]() -> Status {
      VIPER_RETURN_IF_ERROR(CopyDeviceToHost(host.data(), model.ptr(), n, train));
      return CopyHostToDevice(dst.ptr(), host.data(), n, train);
    }));
  }

  // 3. Publish -> live in another process. Where CUDA IPC is refused (some sandboxes), the row
  // says why and the other figures are still measured.
  // Every timed figure follows one publish per buffer (the stores below keep two): each buffer
  // allocated, its host copy pinned and its IPC handle opened by the consumer before timing, as in
  // a training job's steady state. The first uses are slower (pinning host memory most: about
  // 0.7 s per GiB on an H100 virtual machine), on the store's thread, not the producer's.
  constexpr int kWarmups = 2;
  DeviceVersionStore::Options o;
  o.device = dev;
  o.max_buffers = kWarmups;
  VIPER_ASSIGN_OR_RETURN(auto store, DeviceVersionStore::Create(o));
  uint64_t version = 0;
  Status live_st = [&]() -> Status {
    PeerProcess peer;
    VIPER_RETURN_IF_ERROR(peer.Start(c.peer_bin, dev, false));
    std::vector<double> live, live_sealed, sealed, copy, call;
    for (int r = 0; r < c.reps + kWarmups; ++r) {
      ++version;
      int64_t t0 = NowNs();
      VIPER_RETURN_IF_ERROR(store->Publish(tensors, train, VersionStamp{"bench", version, version, 0, 0, {}}));
      int64_t t_call = NowNs();
      VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60)));
      VIPER_ASSIGN_OR_RETURN(GpuVersion v, store->Acquire());
      auto done = peer.Copy(v);
      store->Release(v);
      if (!done.ok()) return done.status();
      VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60), /*sealed=*/true));
      int64_t t_sealed = NowNs();
      if (r < kWarmups) continue;
      live.push_back((done->first - t0) / 1e6);
      call.push_back((t_call - t0) / 1e6);
      sealed.push_back((t_sealed - t0) / 1e6);
      copy.push_back(done->second);
      // Announced after the checksum, the consumer's copy starts then: sealed + its copy.
      live_sealed.push_back((t_sealed - t0) / 1e6 + done->second);
    }
    row.live_ms = Median(live);
    row.sealed_ms = Median(sealed);
    row.live_sealed_ms = Median(live_sealed);
    row.consumer_copy_ms = Median(copy);
    row.publish_call_ms = Median(call);
    return Status::OK();
  }();
  if (!live_st.ok()) row.live_error = live_st.ToString();
  // The same with a consumer that reads the version in place (its parameters are the producer's
  // buffer, leased while in use): live = the producer's copy + the announcement.
  if (live_st.ok()) {
    Status st = [&]() -> Status {
      PeerProcess peer;
      VIPER_RETURN_IF_ERROR(peer.Start(c.peer_bin, dev, true));
      std::vector<double> live;
      for (int r = 0; r < c.reps + kWarmups; ++r) {
        ++version;
        int64_t t0 = NowNs();
        VIPER_RETURN_IF_ERROR(store->Publish(tensors, train, VersionStamp{"bench", version, version, 0, 0, {}}));
        VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60)));
        VIPER_ASSIGN_OR_RETURN(GpuVersion v, store->Acquire());
        auto done = peer.Copy(v);
        store->Release(v);
        if (!done.ok()) return done.status();
        VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60), true));
        if (r >= kWarmups) live.push_back((done->first - t0) / 1e6);
      }
      row.live_in_place_ms = Median(live);
      return Status::OK();
    }();
    if (!st.ok()) row.live_error = "in place: " + st.ToString();
  }

  // 3b. The host path: a subscriber without a GPU (same host, map) gets the GPU version once it is
  // sealed, copied into a segment and committed on the node.
  {
    Status st = [&]() -> Status {
      PublisherOptions po;
      po.model = "gpu-bench";
      po.node.segment_prefix = "viper-gpu-bench";
      VIPER_ASSIGN_OR_RETURN(auto pub, Publisher::Start(po));
      DeviceVersionStore::Options go;
      go.device = dev;
      go.max_buffers = kWarmups;
      VIPER_ASSIGN_OR_RETURN(auto gp, GpuPublisher::Start(pub.get(), go));
      SubscriberOptions so;
      so.model = "gpu-bench";
      so.connect = pub->address();
      VIPER_ASSIGN_OR_RETURN(auto sub, Subscriber::Start(so));
      std::vector<double> lat;
      for (int r = 0; r < std::max(2, c.reps / 2) + kWarmups; ++r) {
        int64_t t0 = NowNs();
        VIPER_ASSIGN_OR_RETURN(uint64_t v, gp->PublishDevice(tensors, train));
        VIPER_ASSIGN_OR_RETURN(auto got, sub->WaitFor(v, std::chrono::seconds(60)));
        int64_t t1 = NowNs();
        if (got->version() != v) return Status::Internal("host path: subscriber got version " + std::to_string(got->version()));
        if (r >= kWarmups) lat.push_back((t1 - t0) / 1e6);
        VIPER_RETURN_IF_ERROR(gp->WaitHost(v, std::chrono::seconds(60)));
      }
      row.host_live_ms = Median(lat);
      return Status::OK();
    }();
    if (!st.ok()) row.host_error = st.ToString();
  }

  // 3c. Through the node, announced device-only when the device copy completes: a Subscriber
  // with gpu_early in another process, copying the version or reading it in place.
  for (bool in_place : {false, true}) {
    auto ms = LiveInSubscriberProcess(c, tensors, train, "gpu-bench-early", 3, {"--early"}, in_place, c.reps, "device-only");
    if (!ms.ok()) {
      row.node_early_error = ms.status().ToString();
      break;
    }
    (in_place ? row.node_early_in_place_ms : row.node_early_ms) = ms->first;
  }

  // 3d. The staged path, as to another host: the subscriber on the network path (path remote),
  // against GPU -> pinned host -> GPU. Two producer buffers: with the subscriber's two, 4 model
  // sizes of GPU memory; at least 3 timed reps, each moving the model through host memory.
  if (auto ms = LiveInSubscriberProcess(c, tensors, train, "gpu-bench-staged", 2, {"--path", "remote"}, false,
                                        std::max(3, c.reps / 2), "host-to-device as its chunks arrived");
      ms.ok()) {
    row.staged_ms = ms->first;
    row.staged_how = ms->second;
  } else {
    row.staged_error = ms.status().ToString();
  }
  // 3e. The floor of any path through the network engine on this host, against which the staged
  // path's pipeline (whose slowest stage it is, where the GPU's copies run at tens of GB/s) is held.
  {
    std::vector<double> gbps;
    Status st = ::access(c.wire_bin.c_str(), X_OK) != 0
                    ? Status::NotFound(c.wire_bin + " not found (it is built with the bench)")
                    : MeasureTcpStream(TcpEnds{c.wire_bin, "", {}, "127.0.0.1", {}}, n, 3, "--verify", gbps);
    if (st.ok() && Median(gbps) > 0) row.wire_ms = static_cast<double>(n) / (Median(gbps) * 1e9) * 1e3;
    else row.wire_error = st.ok() ? "viper_wire_baseline measured no stream" : st.ToString();
  }

  // 4. The training stall: a bandwidth-bound step (4 device copies of a quarter of the model's
  // size, in place on the producer's stream) alone, then with a publish queued beside it.
  {
    uint64_t q = std::max<uint64_t>(n / 4, 256) & ~uint64_t(255);
    VIPER_ASSIGN_OR_RETURN(DeviceBuffer s1, DeviceBuffer::Allocate(dev, q));
    VIPER_ASSIGN_OR_RETURN(DeviceBuffer s2, DeviceBuffer::Allocate(dev, q));
    auto step = [&]() -> Status {
      for (int k = 0; k < 4; ++k)
        VIPER_RETURN_IF_ERROR(CopyDeviceToDevice(k % 2 ? s1.ptr() : s2.ptr(), k % 2 ? s2.ptr() : s1.ptr(), q, train));
      return Status::OK();
    };
    VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60), true));
    VIPER_ASSIGN_OR_RETURN(row.step_ms, TimeOnStream(train, dev, c.reps, step));
    VIPER_ASSIGN_OR_RETURN(Event a, Event::Create(dev, true));
    VIPER_ASSIGN_OR_RETURN(Event b, Event::Create(dev, true));
    std::vector<double> with;
    for (int r = 0; r < c.reps; ++r) {
      ++version;
      VIPER_RETURN_IF_ERROR(a.Record(train));
      VIPER_RETURN_IF_ERROR(store->Publish(tensors, train, VersionStamp{"bench", version, version, 0, 0, {}}));
      VIPER_RETURN_IF_ERROR(step());  // the next training step, queued right after the publish
      VIPER_RETURN_IF_ERROR(b.Record(train));
      VIPER_RETURN_IF_ERROR(b.Synchronize());
      VIPER_ASSIGN_OR_RETURN(float t, Event::ElapsedMs(a, b));
      with.push_back(t);
      VIPER_RETURN_IF_ERROR(store->Wait(version, std::chrono::seconds(60), true));
    }
    row.step_with_publish_ms = Median(with);
    row.stall_ms = std::max(0.0, row.step_with_publish_ms - row.step_ms);
  }
  return row;
}

std::string Gb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  return buf;
}

}  // namespace

Status RunGpu(const GpuConfig& c, const std::string& json_path) {
  VIPER_RETURN_IF_ERROR(Available());
  std::printf("viper bench --gpu on %s, %d timed reps per figure (medians)\n", Describe(c.device).c_str(), c.reps);
  nlohmann::json out = {{"device", Describe(c.device)}, {"reps", c.reps}, {"sizes", nlohmann::json::array()}};
  bool all_ok = true;
  for (uint64_t bytes : c.sizes) {
    Result<Row> r = MeasureSize(c, bytes);
    if (!r.ok()) {
      std::printf("\n%s: FAILED: %s\n", Gb(bytes).c_str(), r.status().ToString().c_str());
      out["sizes"].push_back({{"bytes", bytes}, {"error", r.status().ToString()}});
      all_ok = false;
      continue;
    }
    const Row& w = *r;
    double gbps = w.dtod_ms > 0 ? 2.0 * bytes / (w.dtod_ms * 1e6) : 0;
    std::printf("\n%s model (32 tensors)                          ms      x one DtoD copy\n", Gb(bytes).c_str());
    std::printf("  one device-to-device copy (floor)          %9.2f   1.00   (%.0f GB/s read+write)\n", w.dtod_ms, gbps);
    std::printf("  GPU -> pinned host -> GPU, no Viper        %9.2f   %.2f\n", w.staging_ms, w.staging_ms / w.dtod_ms);
    if (!w.live_error.empty()) {
      std::printf("  publish -> live in another process         NOT MEASURED: %s\n", w.live_error.c_str());
      all_ok = false;
    }
    std::printf("  publish -> live in another process         %9.2f   %.2f   (announced after the device copy)\n",
                w.live_ms, w.live_ms / w.dtod_ms);
    std::printf("    of which the consumer's own copy         %9.2f\n", w.consumer_copy_ms);
    std::printf("  publish -> live, consumer reads in place   %9.2f   %.2f\n", w.live_in_place_ms,
                w.live_in_place_ms / w.dtod_ms);
    std::printf("  publish -> live, announced after checksum  %9.2f   %.2f   (sealed at %.2f ms)\n", w.live_sealed_ms,
                w.live_sealed_ms / w.dtod_ms, w.sealed_ms);
    if (!w.host_error.empty()) {
      std::printf("  publish -> subscriber without a GPU        NOT MEASURED: %s\n", w.host_error.c_str());
      all_ok = false;
    } else {
      std::printf("  publish -> subscriber without a GPU        %9.2f   %.2f   (host path: seal, segment, commit, map)\n",
                  w.host_live_ms, w.host_live_ms / w.dtod_ms);
    }
    if (!w.node_early_error.empty()) {
      std::printf("  through the node, gpu_early                NOT MEASURED: %s\n", w.node_early_error.c_str());
      all_ok = false;
    } else {
      std::printf("  through the node, gpu_early, copied        %9.2f   %.2f   (device-only NOTIFY, Subscriber process)\n",
                  w.node_early_ms, w.node_early_ms / w.dtod_ms);
      std::printf("  through the node, gpu_early, in place      %9.2f   %.2f\n", w.node_early_in_place_ms,
                  w.node_early_in_place_ms / w.dtod_ms);
    }
    if (!w.staged_error.empty()) {
      std::printf("  staged, network path, GPU subscriber       NOT MEASURED: %s\n", w.staged_error.c_str());
      all_ok = false;
    } else {
      std::printf("  staged, network path, GPU subscriber       %9.2f   %.2f   (%.2fx the staging without Viper: %s)\n",
                  w.staged_ms, w.staged_ms / w.dtod_ms, w.staged_ms > 0 ? w.staging_ms / w.staged_ms : 0, w.staged_how.c_str());
    }
    if (!w.wire_error.empty()) {
      std::printf("  its network stage alone                    NOT MEASURED: %s\n", w.wire_error.c_str());
      all_ok = false;
    } else {
      std::printf("  its network stage alone: TCP, loopback     %9.2f   %.2f   (landed and hashed; the staged path %.2fx of it)\n",
                  w.wire_ms, w.wire_ms / w.dtod_ms, w.staged_ms > 0 ? w.wire_ms / w.staged_ms : 0);
    }
    std::printf("  Publish call on the training thread        %9.3f\n", w.publish_call_ms);
    std::printf("  training step alone / with a publish       %9.2f / %.2f\n", w.step_ms, w.step_with_publish_ms);
    std::printf("  training stall                             %9.2f   %.2f\n", w.stall_ms, w.stall_ms / w.dtod_ms);
    std::printf("  targets: live <= 1.5x copy: %s (copied), %s (in place); stall <= 1.2x copy: %s; staged >= 0.8x the staging "
                "without Viper: %s\n",
                w.live_ms <= 1.5 * w.dtod_ms ? "met" : "MISSED", w.live_in_place_ms <= 1.5 * w.dtod_ms ? "met" : "MISSED",
                w.stall_ms <= 1.2 * w.dtod_ms ? "met" : "MISSED",
                w.staged_error.empty() && w.staged_ms > 0 && w.staging_ms / w.staged_ms >= 0.8 ? "met" : "MISSED");
    out["sizes"].push_back({{"bytes", bytes},
                            {"dtod_ms", w.dtod_ms},
                            {"staging_ms", w.staging_ms},
                            {"live_ms", w.live_ms},
                            {"consumer_copy_ms", w.consumer_copy_ms},
                            {"live_in_place_ms", w.live_in_place_ms},
                            {"host_live_ms", w.host_live_ms},
                            {"host_error", w.host_error},
                            {"node_early_ms", w.node_early_ms},
                            {"node_early_in_place_ms", w.node_early_in_place_ms},
                            {"node_early_error", w.node_early_error},
                            {"staged_ms", w.staged_ms},
                            {"staged_over_staging", w.staged_ms > 0 ? w.staging_ms / w.staged_ms : 0},
                            {"staged_how", w.staged_how},
                            {"staged_error", w.staged_error},
                            {"wire_ms", w.wire_ms},
                            {"staged_over_wire", w.staged_ms > 0 ? w.wire_ms / w.staged_ms : 0},
                            {"wire_error", w.wire_error},
                            {"live_after_checksum_ms", w.live_sealed_ms},
                            {"sealed_ms", w.sealed_ms},
                            {"publish_call_ms", w.publish_call_ms},
                            {"step_ms", w.step_ms},
                            {"step_with_publish_ms", w.step_with_publish_ms},
                            {"stall_ms", w.stall_ms},
                            {"live_error", w.live_error}});
    std::fflush(stdout);
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return all_ok ? Status::OK() : Status::Internal("viper bench --gpu: a size failed (above)");
}

}  // namespace viper::bench
