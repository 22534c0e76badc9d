// `viper bench-peer` (hidden): the consumer side of `viper bench`, run as a separate process (in
// another network namespace for --hosts 2). It prints one JSON object per line on stdout and exits
// when its stdin closes (the bench closes it, or dies).
//
//   bench-peer subscribe --connect ADDR --model M --path map|copy|remote|auto
//       a viper::Subscriber; one line per version swapped in, with its timings (CLOCK_REALTIME ns).
//   bench-peer poll --dir D --interval S
//       the baseline users run today: every S seconds (fixed grid, as TensorFlow Serving's
//       file_system_poll_wait_seconds) list D for <version>.safetensors, read the newest new one
//       into a reused buffer and parse it; one line per version loaded.
// Both print {"ready":true,...} first, once they are able to see a version.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "command.h"
#include "node_common.h"
#include "viper/node.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"

namespace viper::cli {
namespace {

struct PeerFlags {
  std::string connect, model = "nt3", path = "map", dir;
  double interval_s = 1.0;
  bool no_verify = false;
  bool verify_local = false;
  AuthFlags auth;
};

std::mutex out_mu;
void PrintLine(const nlohmann::json& j) {
  std::string s = j.dump();
  std::lock_guard<std::mutex> lock(out_mu);
  std::fprintf(stdout, "%s\n", s.c_str());
  std::fflush(stdout);
}

// Blocks until stdin reaches EOF (the bench closed it) or `timeout_ms` passes (-1: forever).
// Returns true on EOF.
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

int RunSubscribe(const PeerFlags& f) {
  auto token = f.auth.Resolve();
  if (!token.ok()) return Fail("bench-peer", token.status());
  auto path = ParseFetchPath(f.path);
  if (!path.ok()) return Fail("bench-peer", path.status());
  SubscriberOptions options;
  options.model = f.model;
  options.connect = f.connect;
  options.token = *token;
  options.path = *path;
  options.verify_checksum = !f.no_verify;
  options.verify_local = f.verify_local;
  options.name = "viper-bench-peer";
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) return Fail("bench-peer", sub.status());
  (*sub)->OnUpdate([](const std::shared_ptr<const ModelVersion>& mv) {
    const UpdateTimings& t = mv->timings;
    PrintLine({{"version", mv->info.version}, {"bytes", mv->info.size}, {"path", std::string(fetch_path_name(mv->path))},
               {"publish_ns", t.publish_ns}, {"completed_ns", t.completed_ns}, {"notified_ns", t.notified_ns},
               {"fetched_ns", t.fetched_ns}, {"verified_ns", t.verified_ns}, {"live_ns", t.live_ns}});
  });
  PrintLine({{"ready", true}, {"host_key", LocalHostKey()}});
  StdinClosed(-1);
  (*sub)->Close();
  return 0;
}

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

int RunPoll(const PeerFlags& f) {
  if (f.interval_s <= 0) return Fail("bench-peer", Status::InvalidArgument("--interval must be > 0"));
  std::filesystem::path dir(f.dir);
  uint64_t seen = NewestVersion(dir);
  std::vector<std::byte> buffer;
  PrintLine({{"ready", true}, {"host_key", LocalHostKey()}});
  auto period = std::chrono::duration<double>(f.interval_s);
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
    if (StdinClosed(static_cast<int>(std::max<int64_t>(0, wait.count())))) return 0;
    uint64_t newest = NewestVersion(dir);
    if (newest <= seen) continue;
    int64_t found_ns = WallClockNs();
    auto path = dir / (std::to_string(newest) + ".safetensors");
    Status st = ReadInto(path, buffer);
    Result<Snapshot> snap = st.ok() ? Snapshot::Parse(buffer, nullptr) : Result<Snapshot>(st);
    if (!snap.ok()) return Fail("bench-peer", snap.status().WithContext(path.string()));
    seen = newest;
    PrintLine({{"version", newest}, {"bytes", buffer.size()}, {"path", "file-poll"}, {"found_ns", found_ns},
               {"live_ns", WallClockNs()}});
  }
}

ViperCommand bench_peer_command(
    "bench-peer", "(internal) consumer process of `viper bench`",
    [](CLI::App& app) -> RunFn {
      app.group("");  // hidden from --help
      auto f = std::make_shared<PeerFlags>();
      auto* sub = app.add_subcommand("subscribe", "Subscriber; one JSON line per update");
      sub->add_option("--connect", f->connect, "Node address HOST:PORT")->required();
      sub->add_option("--model", f->model, "Model name");
      sub->add_option("--path", f->path, "auto|map|copy|remote|file");
      sub->add_flag("--no-verify", f->no_verify, "Verify no checksum");
      sub->add_flag("--verify-local", f->verify_local, "Also verify map/copy bytes (SubscriberOptions::verify_local)");
      f->auth.Add(*sub);
      auto* poll = app.add_subcommand("poll", "Directory poller (the file baseline)");
      poll->add_option("--dir", f->dir, "Directory of <version>.safetensors files")->required();
      poll->add_option("--interval", f->interval_s, "Seconds between polls");
      app.require_subcommand(1);
      return [f, sub] { return sub->parsed() ? RunSubscribe(*f) : RunPoll(*f); };
    },
    1000);

}  // namespace
}  // namespace viper::cli
