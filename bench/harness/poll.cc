// The baseline users run today (see PollResult): the producer writes a plain safetensors file
// (tmp + fsync + rename + fsync(dir)); a separate process (`viper bench-peer poll`) polls the
// directory on a fixed grid and reads the newest file back.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
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
}  // namespace

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

}  // namespace viper::bench
