// The baseline users run today, measured (see PollResult): the producer writes a plain safetensors
// file (tmp + fsync + rename + fsync(dir)); a separate process (`viper bench-peer poll`) polls the
// directory on its own fixed grid and reads the newest file back.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "harness/measure.h"
#include "viper/node.h"

namespace viper::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

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

// When one checkpoint write did what (CLOCK_REALTIME ns).
struct WriteTimes {
  int64_t begin = 0;    // write called
  int64_t written = 0;  // tmp file written and fsynced
  int64_t renamed = 0;  // renamed to its final name: visible to the poller
  int64_t end = 0;      // directory fsynced: the writer is done
  // The writer's time, without the wait before the rename (see WriteCheckpoint).
  double stall() const { return Sec(begin, written) + Sec(renamed, end); }
};

// tmp + fsync + rename + fsync(dir): what a careful checkpoint writer does. Between the fsync and
// the rename it waits until `rename_at(written_ns)`, so that the file becomes visible at a chosen
// moment; that wait is the bench's, not the writer's, and is left out of every figure.
Result<WriteTimes> WriteCheckpoint(const std::filesystem::path& dir, uint64_t version, const SourceModel& m,
                                   const std::string& header, const std::function<int64_t(int64_t)>& rename_at) {
  WriteTimes t;
  t.begin = WallClockNs();
  auto tmp = dir / (std::to_string(version) + ".safetensors.tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno("create " + tmp.string());
  Status st = WriteAll(fd, reinterpret_cast<const std::byte*>(header.data()), header.size(), tmp.string());
  for (const auto& tensor : m.tensors)
    if (st.ok()) st = WriteAll(fd, tensor.bytes.data(), tensor.bytes.size(), tmp.string());
  if (st.ok() && ::fsync(fd) != 0) st = Status::FromErrno("fsync " + tmp.string());
  ::close(fd);
  VIPER_RETURN_IF_ERROR(st);
  t.written = WallClockNs();
  std::this_thread::sleep_for(std::chrono::nanoseconds(rename_at(t.written) - t.written));
  t.renamed = WallClockNs();
  if (::rename(tmp.c_str(), (dir / (std::to_string(version) + ".safetensors")).c_str()) != 0)
    return Status::FromErrno("rename " + tmp.string());
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) ::fsync(dfd), ::close(dfd);
  t.end = WallClockNs();
  return t;
}

// The poller's grid: polls at grid_ns + k * interval (CLOCK_REALTIME ns).
struct Grid {
  int64_t grid_ns = 0;
  int64_t interval_ns = 1;
  // Where `t_ns` falls in the interval, 0..1.
  double Phase(int64_t t_ns) const {
    int64_t into = (t_ns - grid_ns) % interval_ns;
    return static_cast<double>(into < 0 ? into + interval_ns : into) / static_cast<double>(interval_ns);
  }
  // The first time after `earliest_ns` that lies at `phase` of the grid.
  int64_t Next(int64_t earliest_ns, double phase) const {
    int64_t at = grid_ns + static_cast<int64_t>(phase * static_cast<double>(interval_ns));
    if (at < earliest_ns) at += ((earliest_ns - at) / interval_ns + 1) * interval_ns;
    return at;
  }
};

// Timed update k of n becomes visible at phase (order[k] + 0.5) / n of the grid.
std::vector<double> SpreadPhases(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) order[static_cast<size_t>(k)] = k;
  std::shuffle(order.begin(), order.end(), std::mt19937(12345));
  std::vector<double> phases;
  for (int k : order) phases.push_back((k + 0.5) / n);
  return phases;
}

}  // namespace

// One untimed update first (the poller's buffer is faulted in once, as a long-running server's is),
// then reps updates, each renamed into view at its phase of the poller's grid (SpreadPhases).
Result<PollResult> RunPoll(const Config& c, const SourceModel& m, const std::string& label) {
  PollResult r;
  r.interval_s = c.poll_interval_s;
  std::filesystem::path dir = std::filesystem::path(c.file_dir) / ("poll-" + label);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::FromErrno("create " + dir.string(), ec.value());
  std::string header = SafetensorsHeader(m);
  json ready;
  VIPER_ASSIGN_OR_RETURN(auto poller, StartPeer(c, {"poll", "--dir", dir.string(), "--interval", std::to_string(c.poll_interval_s)},
                                                &ready));
  Grid grid{ready.value("grid_ns", int64_t{0}), static_cast<int64_t>(c.poll_interval_s * 1e9)};
  if (grid.grid_ns == 0 || grid.interval_ns <= 0) return Status::Internal("the poller did not report its grid: " + ready.dump());
  const std::vector<double> phases = SpreadPhases(c.baseline_reps);
  for (int i = 0; i <= c.baseline_reps; ++i) {
    uint64_t version = static_cast<uint64_t>(i) + 1;
    auto rename_at = [&](int64_t written_ns) {  // the warm-up at once, the others at their phase, 1 ms ahead at the earliest
      return i == 0 ? written_ns : grid.Next(written_ns + 1000000, phases[static_cast<size_t>(i - 1)]);
    };
    VIPER_ASSIGN_OR_RETURN(WriteTimes w, WriteCheckpoint(dir, version, m, header, rename_at));
    VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*poller, version, TransferTimeout(m.data_bytes) + milliseconds(static_cast<int64_t>(3000 * c.poll_interval_s))));
    std::filesystem::remove(dir / (std::to_string(version - 1) + ".safetensors"), ec);
    if (i == 0) continue;
    r.e2e.Add(Sec(w.begin, w.written) + Sec(w.renamed, j["live_ns"]));
    r.stall.Add(w.stall());
    r.wait.Add(Sec(w.renamed, j["found_ns"]));
    r.read.Add(Sec(j["found_ns"], j["live_ns"]));
    r.phases.push_back(grid.Phase(w.renamed));
  }
  poller->Stop();
  std::filesystem::remove_all(dir, ec);
  return r;
}

}  // namespace viper::bench
