// The client commands: publish, watch, pull, ls. Each connects to a node with --connect.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <climits>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/client.h"
#include "core/fd.h"
#include "command.h"
#include "node_common.h"
#include "progress.h"
#include "registry_cli.h"
#include "seal.h"
#include "store/host_tier.h"
#include "temp_file.h"
#include "viper/metrics.h"
#include "viper/node.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"

namespace viper::cli {
namespace {

Result<std::unique_ptr<Client>> ConnectClient(const std::string& connect, const AuthFlags& auth) {
  VIPER_ASSIGN_OR_RETURN(std::string token, auth.Resolve());
  ClientOptions options;
  options.connect = connect;
  options.token = token;
  options.name = "viper-cli";
  return Client::Connect(options);
}

double Ms(int64_t from_ns, int64_t to_ns) { return (to_ns - from_ns) / 1e6; }

// ------------------------------------------------------------------ publish

struct PublishFlags {
  std::string model, file, connect;
  uint64_t step = 0;
  bool json = false;
  AuthFlags auth;
};

// The node stamps the version into the header in place, which needs Viper's layout: a foreign
// file is rebuilt from its tensors (one copy), keeping its metadata outside viper.*.
Result<Snapshot> InViperLayout(Snapshot file) {
  if (SnapshotLayout::Of(file).ok()) return file;
  std::vector<TensorData> tensors;
  for (const TensorInfo& t : file.tensors()) tensors.push_back({{t.name, t.dtype, t.shape}, file.tensor_data(t)});
  std::map<std::string, std::string> user;
  for (const auto& [k, v] : file.metadata())
    if (!k.starts_with("viper.")) user.emplace(k, v);
  VersionStamp stamp;
  stamp.step = file.step().value_or(0);
  stamp.loss = file.loss();
  return BuildSnapshot(tensors, stamp, std::move(user));
}

int RunPublish(const PublishFlags& f) {
  int64_t publish_ns = WallClockNs();
  ParseOptions parse;
  parse.verify_checksum = true;
  auto snap = Snapshot::OpenFile(f.file, parse);
  if (!snap.ok()) return Fail("publish", snap.status());
  auto laid_out = InViperLayout(std::move(snap).value());
  if (!laid_out.ok()) return Fail("publish", laid_out.status().WithContext(f.file));
  auto client = ConnectClient(f.connect, f.auth);
  if (!client.ok()) return Fail("publish", client.status());
  auto bar = ProgressBar::ForStderr("sending");
  auto version = (*client)->Publish(f.model, laid_out->bytes(), f.step, publish_ns,
                                    bar->enabled() ? ProgressFn([bar](uint64_t done, uint64_t total) {
                                      bar->Update(done, total);
                                    })
                                                   : ProgressFn());
  if (!version.ok()) {
    bar->Abandon();
    return Fail("publish", version.status());
  }
  bar->Abandon();  // the node answered: every chunk is in, whatever order the completions came
  const uint64_t bytes = laid_out->bytes().size();
  const double seconds = (WallClockNs() - publish_ns) / 1e9;
  const uint64_t step = f.step != 0 ? f.step : laid_out->step().value_or(0);  // what the node records
  if (f.json) {
    nlohmann::json out = {{"command", "publish"}, {"model", f.model}, {"version", *version}, {"step", step},
                          {"bytes", bytes}, {"seconds", seconds}, {"file", f.file}, {"node", f.connect}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("published %s version %" PRIu64 " (%s) in %s\n", f.model.c_str(), *version,
              HumanBytes(static_cast<double>(bytes)).c_str(), HumanSeconds(seconds).c_str());
  return 0;
}

ViperCommand publish_command(
    "publish", "Publish a safetensors file as the next version of MODEL",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<PublishFlags>();
      app.add_option("MODEL", f->model, "Model name")->required()->check(ModelName());
      app.add_option("FILE", f->file, "A .safetensors file")->required()->check(ReadableFile());
      app.add_option("--step", f->step,
                     "Training step recorded with the version (0, the default: the file's own viper.step, if any)")
          ->check(NonNegativeInteger());
      app.add_flag("--json", f->json,
                   "Print one JSON object on stdout instead of the line: command, model, version, step, bytes, "
                   "seconds, file, node");
      AddConnect(app, f->connect);
      f->auth.Add(app);
      return [f] { return RunPublish(*f); };
    },
    20);

// ------------------------------------------------------------------ watch

struct WatchFlags {
  std::string model, connect, path = std::string(fetch_path_name(SubscriberOptions{}.path)), file_dir, registry, registry_password_file;
  std::vector<std::string> alternates;
  bool json = false, verify_local = false;
  uint64_t count = 0;
  double timeout_s = 0;
  // --liveness: the silence from the node before a probe, and the wait for its answer.
  double liveness_s = std::chrono::duration<double>(SubscriberOptions{}.liveness_probe).count();
  AuthFlags auth;
};

// A version complete before the watch started (the live one, sent on subscribing) has no
// publish -> live latency of this watch: its "latency" would be its age. By the producer node's
// clock against this host's (skew across hosts blurs versions completed right at the start); a
// device-only announcement has no completion time and never counts as before.
bool CompleteBefore(const ModelVersion& mv, int64_t watch_start_ns) {
  return mv.timings.completed_ns != 0 && mv.timings.completed_ns < watch_start_ns;
}

nlohmann::json UpdateJson(const ModelVersion& mv, int64_t watch_start_ns) {
  const UpdateTimings& t = mv.timings;
  return {{"model", mv.info.model},
          {"version", mv.info.version},
          {"step", mv.info.step},
          {"bytes", mv.info.size},
          {"checksum", checksum_hex(mv.info.checksum)},
          {"path", std::string(fetch_path_name(mv.path))},
          {"reason", mv.reason},
          {"delta", mv.delta_base != 0},
          {"delta_base", mv.delta_base},
          {"wire_bytes", mv.wire_bytes},
          {"publish_ns", t.publish_ns},
          {"completed_ns", t.completed_ns},
          {"notified_ns", t.notified_ns},
          {"fetched_ns", t.fetched_ns},
          {"verified_ns", t.verified_ns},
          {"live_ns", t.live_ns},
          {"publish_to_live_ms", t.publish_ns ? Ms(t.publish_ns, t.live_ns) : 0.0},
          {"complete_to_live_ms", Ms(t.completed_ns, t.live_ns)},
          {"notify_ms", Ms(t.completed_ns, t.notified_ns)},
          {"complete_before_watch", CompleteBefore(mv, watch_start_ns)}};
}

std::string UpdateLine(const ModelVersion& mv, int64_t watch_start_ns) {
  const UpdateTimings& t = mv.timings;
  std::string via(fetch_path_name(mv.path));
  if (mv.delta_base != 0)
    via += fmt::format(" (delta of {} against v{})", HumanBytes(static_cast<double>(mv.wire_bytes)), mv.delta_base);
  std::string head = fmt::format("{} v{} step {} {} via {}: ", mv.info.model, mv.info.version, mv.info.step,
                                 HumanBytes(static_cast<double>(mv.info.size)), via);
  if (CompleteBefore(mv, watch_start_ns))
    return head + fmt::format("complete {:.2f} s before this watch started (fetch {:.2f} ms, verify {:.2f} ms) [{}]",
                              (watch_start_ns - t.completed_ns) / 1e9, Ms(t.notified_ns, t.fetched_ns),
                              Ms(t.fetched_ns, t.verified_ns), mv.reason);
  return head + fmt::format("publish->live {:.2f} ms (notify {:.3f} ms, fetch {:.2f} ms, verify {:.2f} ms) [{}]",
                            t.publish_ns ? Ms(t.publish_ns, t.live_ns) : 0.0, Ms(t.completed_ns, t.notified_ns),
                            Ms(t.notified_ns, t.fetched_ns), Ms(t.fetched_ns, t.verified_ns), mv.reason);
}

int RunWatch(const WatchFlags& f) {
  auto token = f.auth.Resolve();
  if (!token.ok()) return Fail("watch", token.status());
  auto path = ParseFetchPath(f.path);
  if (!path.ok()) return Fail("watch", path.status());
  if (*path == FetchPath::kFile && f.file_dir.empty()) {  // (it read ./MODEL/ of wherever it ran)
    return Fail("watch", Status::InvalidArgument("--path file needs --file-dir (the node's --store-dir)"));
  }
  SubscriberOptions options;
  options.model = f.model;
  options.connect = f.connect;
  options.registry = f.registry;
  auto password = RegistryPassword(f.registry_password_file);
  if (!password.ok()) return Fail("watch", password.status());
  options.registry_password = *password;
  options.token = *token;
  options.path = *path;
  options.verify_local = f.verify_local;
  options.alternates = f.alternates;
  options.file_dir = f.file_dir;
  options.name = "viper-watch";
  SetLiveness(f.liveness_s, &options.liveness_probe, &options.liveness_timeout);
  sigset_t stop = BlockStopSignals();  // before any thread starts
  const int64_t start_ns = WallClockNs();
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) return Fail("watch", sub.status());
  std::mutex mu;
  std::condition_variable cv;
  uint64_t seen = 0;
  (*sub)->OnUpdate([&](const std::shared_ptr<const ModelVersion>& mv) {
    std::string line = f.json ? UpdateJson(*mv, start_ns).dump() : UpdateLine(*mv, start_ns);
    std::lock_guard<std::mutex> lock(mu);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    ++seen;
    cv.notify_all();
  });
  // Stop on a signal, after --count updates, or after --timeout seconds.
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    std::lock_guard<std::mutex> lock(mu);
    seen = UINT64_MAX;
    cv.notify_all();
  });
  signals.detach();
  std::unique_lock<std::mutex> lock(mu);
  auto done = [&] { return seen == UINT64_MAX || (f.count > 0 && seen >= f.count); };
  bool finished = f.timeout_s > 0 ? cv.wait_for(lock, std::chrono::duration<double>(f.timeout_s), done)
                                  : (cv.wait(lock, done), true);
  lock.unlock();
  (*sub)->Close();
  if (!finished && f.count > 0) {
    return Fail("watch", Status::Timeout("saw " + std::to_string(seen) + " of " + std::to_string(f.count) +
                                         " updates within the timeout"));
  }
  return 0;
}

ViperCommand watch_command(
    "watch", "Follow MODEL: one line per update with its latencies",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<WatchFlags>();
      app.add_option("MODEL", f->model, "Model name")->required()->check(ModelName());
      AddConnect(app, f->connect);
      app.add_flag("--json", f->json, "One JSON object per line (complete_before_watch: the version was complete before the watch started, by the producer node's clock, so its latencies are its age)");
      app.add_option("--path", f->path, "auto|map|copy|remote|file")
          ->capture_default_str()
          ->check(OneOf({"auto", "map", "copy", "remote", "file"}));
      app.add_option("--file-dir", f->file_dir, "The node's store dir as seen from here (file fallback)")
          ->check(PathText());
      app.add_flag("--verify-local", f->verify_local, "Also verify versions mapped or copied from this host's node");
      app.add_option("--alternate", f->alternates, "Subscribe through this HOST:PORT while --connect is unreachable (repeatable)")
          ->check(HostPort());
      app.add_option("--liveness", f->liveness_s,
                     "Seconds of silence from the node before it is asked to answer, and then for its answer; no "
                     "answer and the watch reconnects (to an alternate, or another holder in the registry). 0: never asked")
          ->capture_default_str()
          ->check(ZeroOrSecondsIn(0.1, 3600));
      AddRegistry(app, f->registry, f->registry_password_file);
      app.add_option("--count", f->count, "Exit after N updates (0: no limit)")->check(NonNegativeInteger());
      app.add_option("--timeout", f->timeout_s, "Exit after this many seconds (0: none; error if --count not reached)")
          ->check(SecondsIn(0, kMaxWaitSeconds));
      f->auth.Add(app);
      return [f] { return RunWatch(*f); };
    },
    30);

// ------------------------------------------------------------------ pull

struct PullFlags {
  std::string model, connect, output, registry, registry_password_file;
  uint64_t version = 0;
  bool json = false;
  AuthFlags auth;
};

// The temporary file a pull is writing, removed by the handler of SIGINT and SIGTERM before the
// signal ends the process as it would have (else an interrupted pull of a large model left a
// file of up to its size behind, under a new random name each time).
char g_pull_temp[PATH_MAX];
std::atomic<int> g_pull_temp_armed{0};    // g_pull_temp names the file
std::atomic<int> g_pull_stop_signal{0};   // a stop signal came (on any thread)
static_assert(std::atomic<int>::is_always_lock_free);  // used in a signal handler

[[noreturn]] void RemoveTempAndDie(int sig) {
  ::unlink(g_pull_temp);  // async-signal-safe, as are the two calls below
  std::signal(sig, SIG_DFL);
  std::raise(sig);
  std::_Exit(128 + sig);  // (raise does not return for these signals)
}

void OnStopSignal(int sig) {
  g_pull_stop_signal.store(sig);
  if (g_pull_temp_armed.load()) RemoveTempAndDie(sig);
  // Not armed yet: Arm() sees the signal and acts on it (each side writes, then reads the other's
  // flag, so one of them always sees both).
}

// While alive: SIGINT and SIGTERM remove the temporary file named by Arm() before they end the
// process as they would have. Installed before the file is made, so that no signal falls between.
class TempRemovedOnSignal {
 public:
  TempRemovedOnSignal() {
    g_pull_temp_armed.store(0);
    g_pull_stop_signal.store(0);
    std::signal(SIGINT, OnStopSignal);
    std::signal(SIGTERM, OnStopSignal);
  }
  void Arm(const std::string& path) {
    std::snprintf(g_pull_temp, sizeof(g_pull_temp), "%s", path.c_str());
    g_pull_temp_armed.store(1);
    if (int sig = g_pull_stop_signal.load(); sig != 0) RemoveTempAndDie(sig);
  }
  ~TempRemovedOnSignal() {
    g_pull_temp_armed.store(0);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    if (int sig = g_pull_stop_signal.load(); sig != 0) std::raise(sig);  // one that came before any file
  }
};

// Writes all of `bytes` to `fd`.
Status WriteAll(int fd, std::span<const std::byte> bytes, const std::string& what, ProgressBar& bar) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, 8u << 20));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("write " + what);
    done += static_cast<size_t>(n);
    if (done < bytes.size()) bar.Update(done, bytes.size());  // the whole is drawn at the end
  }
  return Status::OK();
}

// -o on something that is not a regular file (a FIFO, a device such as /dev/stdout, a socket): the
// bytes are written into it, as `cat > path` would; renaming a file over it would replace it.
bool IsStream(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

Status WriteIntoStream(const std::string& path, std::span<const std::byte> bytes, ProgressBar& bar) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno("open " + path);
  VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), bytes, path, bar));
  if (fd.Close() != 0) return Status::FromErrno("close " + path);
  return Status::OK();
}

// The temporary file next to `path` is created exclusively under an unpredictable name
// (temp_file.h): a link or file another user planted in a shared directory is never written. A
// `path` that is a symbolic link to a file has that file replaced (the link stays).
Status WriteFileAtomically(std::string path, std::span<const std::byte> bytes, ProgressBar& bar) {
  if (IsStream(path)) return WriteIntoStream(path, bytes, bar);
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char target[PATH_MAX];
    if (::realpath(path.c_str(), target) != nullptr) path = target;  // (dangling: the link is replaced)
  }
  TempRemovedOnSignal cleanup;
  VIPER_ASSIGN_OR_RETURN(internal::TempFile temp, internal::CreateTempNextTo(path, 0644));
  const std::string tmp = temp.path.string();
  cleanup.Arm(tmp);
  int fd = temp.fd.get();
  if (Status st = WriteAll(fd, bytes, tmp, bar); !st.ok()) {
    temp.fd.Close();
    ::unlink(tmp.c_str());
    return st;
  }
  if (::fsync(fd) != 0) {
    Status st = Status::FromErrno("fsync " + tmp);
    temp.fd.Close();
    ::unlink(tmp.c_str());
    return st;
  }
  if (temp.fd.Close() != 0) {
    Status st = Status::FromErrno("close " + tmp);
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {  // e.g. `path` is a directory: no temporary left behind
    Status st = Status::FromErrno("rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return st;
  }
  return Status::OK();
}

int RunPull(const PullFlags& f) {
  const int64_t start_ns = WallClockNs();
  auto token = f.auth.Resolve();
  if (!token.ok()) return Fail("pull", token.status());
  std::vector<std::string> holders{f.connect};
  if (!f.registry.empty()) {
    auto password = RegistryPassword(f.registry_password_file);
    if (!password.ok()) return Fail("pull", password.status());
    auto found = NodesHolding(f.registry, *password, f.model, f.version, *token);
    if (!found.ok()) return Fail("pull", found.status());
    holders = *found;
  }
  // A holder that does not answer (dead, or not of this fleet: it cannot prove the token) is
  // skipped for the next one the registry lists.
  std::string connect = holders.front();
  auto client = ConnectClient(connect, f.auth);
  for (size_t i = 1; i < holders.size() && !client.ok(); ++i) {
    std::fprintf(stderr, "viper pull: holder %s: %s; trying %s\n", connect.c_str(), client.status().message().c_str(),
                 holders[i].c_str());
    connect = holders[i];
    client = ConnectClient(connect, f.auth);
  }
  if (!client.ok()) return Fail("pull", client.status());
  Client& c = **client;
  auto fetch_bar = ProgressBar::ForStderr("fetching");
  auto write_bar = ProgressBar::ForStderr("writing");
  std::vector<std::byte> buffer;
  std::span<const std::byte> bytes;
  proto::VersionInfo info;
  std::shared_ptr<const void> hold;
  if (c.same_host()) {  // map the node's segment: no transfer at all
    auto ok = c.FetchLease(f.model, f.version);
    if (!ok.ok()) return Fail("pull", ok.status());
    auto mapped = MapSegmentReadOnly(ok->segment, ok->info.size);
    if (!mapped.ok()) return Fail("pull", mapped.status());
    hold = mapped->owner;
    bytes = mapped->data;
    info = ok->info;
  } else {
    auto ok = c.FetchSend(
        f.model, f.version,
        [&](const proto::VersionInfo& vi) -> Result<std::span<std::byte>> {
          buffer.resize(vi.size);
          return std::span<std::byte>(buffer);
        },
        fetch_bar->enabled() ? ProgressFn([fetch_bar](uint64_t done, uint64_t total) { fetch_bar->Update(done, total); })
                             : ProgressFn());
    fetch_bar->Abandon();
    if (!ok.ok()) return Fail("pull", ok.status());
    bytes = buffer;
    info = ok->info;
  }
  // With the fleet's token, only a version a node of the fleet sealed is written out.
  if (Status sealed = internal::CheckSeal(*token, info, "node " + connect); !sealed.ok()) return Fail("pull", sealed);
  auto snap = Snapshot::Parse(bytes, hold);
  if (!snap.ok()) return Fail("pull", snap.status());
  if (snap->compute_checksum() != info.checksum)
    return Fail("pull", Status::Corruption("checksum of the received bytes does not match the node's"));
  if (Status st = WriteFileAtomically(f.output, bytes, *write_bar); !st.ok()) {
    write_bar->Abandon();
    return Fail("pull", st);
  }
  write_bar->Update(bytes.size(), bytes.size());
  if (c.same_host()) c.Release(info.model, info.version);
  const double seconds = (WallClockNs() - start_ns) / 1e9;
  if (f.json) {
    nlohmann::json out = {{"command", "pull"}, {"model", info.model}, {"version", info.version}, {"step", info.step},
                          {"bytes", info.size}, {"seconds", seconds}, {"file", f.output},
                          {"checksum", checksum_hex(info.checksum)}, {"node", connect},
                          {"path", c.same_host() ? "map" : "remote"}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("pulled %s version %" PRIu64 " (%s) to %s\n", info.model.c_str(), info.version,
              HumanBytes(static_cast<double>(info.size)).c_str(), f.output.c_str());
  return 0;
}

ViperCommand pull_command(
    "pull", "Save a version of MODEL to a safetensors file",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<PullFlags>();
      app.add_option("MODEL", f->model, "Model name")->required()->check(ModelName());
      app.add_option("--version", f->version, "Version to pull (default: the latest)")->check(NonNegativeInteger());
      app.add_option("-o,--output", f->output, "Output file")->required()->check(NewFile());
      app.add_flag("--json", f->json,
                   "Print one JSON object on stdout instead of the line: command, model, version, step, bytes, "
                   "seconds, file, checksum, node, path (map: the node's segment on this host; remote: fetched)");
      AddConnect(app, f->connect);
      AddRegistry(app, f->registry, f->registry_password_file);
      f->auth.Add(app);
      return [f] { return RunPull(*f); };
    },
    40);

// ------------------------------------------------------------------ ls

struct LsFlags {
  std::string connect, registry, registry_password_file;
  bool json = false;
  AuthFlags auth;
};

int RunLs(const LsFlags& f) {
  if (!f.registry.empty()) {
    auto password = RegistryPassword(f.registry_password_file);
    if (!password.ok()) return Fail("ls", password.status());
    auto token = f.auth.Resolve();
    if (!token.ok()) return Fail("ls", token.status());
    return RunLsRegistry(f.registry, *password, *token, f.json);
  }
  auto client = ConnectClient(f.connect, f.auth);
  if (!client.ok()) return Fail("ls", client.status());
  auto versions = (*client)->List();
  if (!versions.ok()) return Fail("ls", versions.status());
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : *versions) {
      nlohmann::json replicas = nlohmann::json::array();
      for (const auto& r : v.replicas) replicas.push_back(ReplicaText(r));
      out.push_back({{"model", v.model}, {"version", v.version}, {"bytes", v.size}, {"step", v.step},
                     {"checksum", checksum_hex(v.checksum)}, {"replicas", replicas}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-20s %8s %12s %10s  %s\n", "MODEL", "VERSION", "SIZE", "STEP", "REPLICAS");
  for (const auto& v : *versions) {
    std::string replicas;
    for (const auto& r : v.replicas) replicas += (replicas.empty() ? "" : " ") + ReplicaText(r);
    std::printf("%-20s %8" PRIu64 " %12s %10" PRIu64 "  %s\n", v.model.c_str(), v.version,
                HumanBytes(static_cast<double>(v.size)).c_str(), v.step, replicas.c_str());
  }
  if (versions->empty()) std::printf("(no models)\n");
  return 0;
}

ViperCommand ls_command(
    "ls", "List the models, versions and replicas a node (or a registry) holds",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<LsFlags>();
      AddConnect(app, f->connect);
      AddRegistry(app, f->registry, f->registry_password_file);
      app.add_flag("--json", f->json, "JSON output");
      f->auth.Add(app);
      return [f] { return RunLs(*f); };
    },
    50);

// ------------------------------------------------------------------ stats

struct StatsFlags {
  std::string connect;
  bool json = false;
  bool prometheus = false;
  AuthFlags auth;
};

int RunStats(const StatsFlags& f) {
  if (f.json && f.prometheus) return Fail("stats", Status::InvalidArgument("--json and --prometheus: give one of them"));
  auto client = ConnectClient(f.connect, f.auth);
  if (!client.ok()) return Fail("stats", client.status());
  auto counters = (*client)->Stats();
  if (!counters.ok()) return Fail("stats", counters.status());
  if (f.json) {
    std::printf("%s\n", nlohmann::json(*counters).dump(2).c_str());
    return 0;
  }
  if (f.prometheus) {
    std::fputs(PrometheusText(*counters).c_str(), stdout);
    return 0;
  }
  for (const auto& [name, value] : *counters)
    if (!IsHistogramCounter(name)) std::printf("%-28s %" PRIu64 "\n", name.c_str(), value);
  for (const NamedHistogram& h : HistogramsFromCounters(*counters)) {
    const uint64_t n = h.count();
    std::printf("%-28s %" PRIu64 " observed, mean %.3f ms\n", (h.name + " latency").c_str(), n,
                n == 0 ? 0.0 : static_cast<double>(h.sum_us) / 1e3 / static_cast<double>(n));
  }
  return 0;
}

ViperCommand stats_command(
    "stats", "Print a node's counters (bytes sent to peers, versions, peers, ...)",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<StatsFlags>();
      AddConnect(app, f->connect);
      app.add_flag("--json", f->json, "JSON output (the counters by name, histograms as hist_* counters)");
      app.add_flag("--prometheus", f->prometheus,
                   "Prometheus text exposition format (counters, gauges, latency histograms)");
      f->auth.Add(app);
      return [f] { return RunStats(*f); };
    },
    55);

}  // namespace
}  // namespace viper::cli
