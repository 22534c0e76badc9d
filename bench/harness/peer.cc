// The consumer processes of `viper bench` (see peer.h).
#include "harness/peer.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper::bench {

namespace {
std::mutex out_mu;
}  // namespace

void PrintLine(const nlohmann::json& j) {
  std::string s = j.dump();
  std::lock_guard<std::mutex> lock(out_mu);
  std::fprintf(stdout, "%s\n", s.c_str());
  std::fflush(stdout);
}

bool StdinClosed(int timeout_ms) {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char buf[256];
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n <= 0) return true;
    if (timeout_ms >= 0) return false;
  }
}

namespace {

// The newest <version>.safetensors in `dir` (0 if none).
uint64_t NewestVersion(const std::filesystem::path& dir) {
  uint64_t newest = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!name.ends_with(".safetensors")) continue;
    std::string stem = name.substr(0, name.size() - 12);
    if (stem.empty() || stem.size() > 19 || stem.find_first_not_of("0123456789") != std::string::npos) continue;
    newest = std::max<uint64_t>(newest, std::stoull(stem));
  }
  return newest;
}

Status ReadInto(const std::filesystem::path& path, std::vector<std::byte>& buffer) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::NotFound("cannot open " + path.string());
  auto size = static_cast<size_t>(in.tellg());
  if (buffer.size() != size) buffer.resize(size);  // reused across versions of one size
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(size)))
    return Status::FromErrno("read " + path.string());
  return Status::OK();
}

}  // namespace

Status RunSubscriberPeer(const SubscriberOptions& options) {
  VIPER_ASSIGN_OR_RETURN(auto sub, Subscriber::Start(options));
  // "ready" first, then the callback: the version already live at the node may load at once, and
  // OnUpdate hands it over after "ready" (the bench waits for the versions it publishes after
  // "ready", and skips lines of older ones).
  PrintLine({{"ready", true}, {"host_key", LocalHostKey()}});
  sub->OnUpdate([](const std::shared_ptr<const ModelVersion>& mv) {
    const UpdateTimings& t = mv->timings;
    PrintLine({{"version", mv->info.version}, {"bytes", mv->info.size}, {"path", std::string(fetch_path_name(mv->path))},
               {"publish_ns", t.publish_ns}, {"completed_ns", t.completed_ns}, {"notified_ns", t.notified_ns},
               {"fetched_ns", t.fetched_ns}, {"verified_ns", t.verified_ns}, {"live_ns", t.live_ns},
               {"delta_base", mv->delta_base}, {"wire_bytes", mv->wire_bytes}, {"reason", mv->reason},
               {"checksum", mv->info.checksum}});
  });
  StdinClosed(-1);
  sub->Close();
  return Status::OK();
}

Status RunWakePeer() {
  PrintLine({{"ready", true}});
  pollfd p{STDIN_FILENO, POLLIN, 0};
  char buf[256];
  for (;;) {
    int r = ::poll(&p, 1, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno("poll stdin");
    int64_t woken_ns = WallClockNs();
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n <= 0) return Status::OK();  // EOF: the bench is done
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] == '\n') PrintLine({{"woken_ns", woken_ns}});
  }
}

Status RunPollerPeer(const std::string& dir_name, double interval_s) {
  if (interval_s <= 0) return Status::InvalidArgument("--interval must be > 0");
  std::filesystem::path dir(dir_name);
  uint64_t seen = NewestVersion(dir);
  std::vector<std::byte> buffer;
  // The grid: polls at start + k * period on the steady clock; the bench is told where that is on
  // CLOCK_REALTIME (grid_ns) to place its updates at known phases of it.
  auto period = std::chrono::duration<double>(interval_s);
  auto next = std::chrono::steady_clock::now();
  const int64_t grid_ns = WallClockNs();
  PrintLine({{"ready", true}, {"host_key", LocalHostKey()}, {"grid_ns", grid_ns}, {"interval_s", interval_s}});
  for (;;) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
    if (StdinClosed(static_cast<int>(std::max<int64_t>(0, wait.count())))) return Status::OK();
    uint64_t newest = NewestVersion(dir);
    if (newest <= seen) continue;
    int64_t found_ns = WallClockNs();
    auto path = dir / (std::to_string(newest) + ".safetensors");
    Status st = ReadInto(path, buffer);
    Result<Snapshot> snap = st.ok() ? Snapshot::Parse(buffer, nullptr) : Result<Snapshot>(st);
    if (!snap.ok()) return snap.status().WithContext(path.string());
    seen = newest;
    PrintLine({{"version", newest}, {"bytes", buffer.size()}, {"path", "file-poll"}, {"found_ns", found_ns},
               {"live_ns", WallClockNs()}});
  }
}

}  // namespace viper::bench
