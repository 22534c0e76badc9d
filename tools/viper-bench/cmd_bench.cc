// `viper bench`, a command of the viper-bench program (`viper bench` execs it): the flags of the
// benchmark harness (bench/harness/bench.h, which measures and prints). --hosts 2 re-runs this
// command inside two network namespaces with --hosts-stage 2.
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include "cli_checks.h"
#include "command.h"
#include "harness/bench.h"
#include "harness/fanout.h"
#include "harness/gpu.h"
#include "harness/child.h"
#include "viper/relay.h"
#include "viper/units.h"

namespace viper::cli {
namespace {

struct BenchFlags {
  std::string sizes = "64Mi,600M,1.7G";
  bool quick = false;
  // warmup 8: a row's first updates fault its pool's fresh segments in (1.2-6 s each at 1.7 GB),
  // and the next ~3 recycled ones still ran 1.5-1.8x slower (245-283 ms against 158 ms, no page
  // faults, a transient of the VM after gigabytes of fresh memory); with 4 warm-ups those landed
  // in the timed medians. A training job publishes hundreds of versions: the steady state counts.
  int reps = 5, warmup = 8, baseline_reps = 3, notify_count = 1000;
  double poll_interval = 1.0;
  std::string json_path, hosts_script, file_dir = "/var/tmp";
  bool no_diagnostic_rows = false;
  int hosts = 1;
  int hosts_stage = 0;
  bool gpu = false;     // --gpu: only the GPU benchmark (bench/harness/gpu.h)
  bool fanout = false;  // --fanout: only the fan-out benchmark (bench/harness/fanout.h)
  int fanout_hosts = 4, consumers = 8;
  std::string link_rate;
  bool auto_place = false;     // --auto: the relays are placed by a registry (bench/harness/fanout.h)
  int max_children = static_cast<int>(kDefaultRelayChildren);
  bool fanout_verify = false;  // --fanout-verify: consumers hash what they map
  int subscribers = 0;  // > 0: only the load benchmark (bench/harness/load.cc)
  std::vector<std::string> only;
  std::string delta_bytes = "256Mi";
  std::string delta_models;
  int delta_threads = 2;
  CLI::App* app = nullptr;
};

// "64Mi", "600M", "1.7G", "1000000" (viper/units.h), more than zero.
Result<uint64_t> ParseSize(const std::string& text) {
  VIPER_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(text, "size"));
  if (bytes == 0) return Status::InvalidArgument("size '" + text + "' must be more than 0 bytes");
  return bytes;
}

Result<bench::Config> MakeConfig(const BenchFlags& f) {
  bench::Config c;
  std::stringstream ss(f.sizes);
  for (std::string item; std::getline(ss, item, ',');) {
    VIPER_ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(item));
    c.sizes.emplace_back(item, bytes);
  }
  if (c.sizes.empty()) return Status::InvalidArgument("--sizes is empty");
  bool q = f.quick;
  auto pick = [&](const char* name, int value, int quick_value) { return q && f.app->count(name) == 0 ? quick_value : value; };
  c.reps = pick("--reps", f.reps, 2);
  c.warmup = pick("--warmup", f.warmup, 2);
  c.baseline_reps = pick("--baseline-reps", f.baseline_reps, 1);
  c.notify_count = pick("--notify-count", f.notify_count, 200);
  c.poll_interval_s = f.poll_interval;
  c.quick = q;
  c.hosts = f.hosts;
  c.diagnose = !f.no_diagnostic_rows;
  c.only = f.only;
  VIPER_ASSIGN_OR_RETURN(c.delta_bytes, ParseSize(f.delta_bytes));
  c.delta_threads = f.delta_threads;
  if (c.delta_threads < 1) return Status::InvalidArgument("--delta-threads must be at least 1");
  c.delta_models = f.delta_models.empty() ? "" : std::filesystem::absolute(f.delta_models).string();
  if (c.reps < 1 || c.warmup < 0 || c.baseline_reps < 1 || c.notify_count < 1 || c.poll_interval_s <= 0)
    return Status::InvalidArgument("--reps, --baseline-reps, --notify-count and --poll-interval must be positive");
  c.file_dir = (std::filesystem::path(f.file_dir) / ("viper-bench-" + std::to_string(::getpid()))).string();
  c.wire_bin = (std::filesystem::path(bench::SelfExe()).parent_path() / "viper_wire_baseline").string();
  return c;
}

// This command again, for the inner stage of --hosts 2 (the flags the user gave, passed on).
std::vector<std::string> InnerArgs(const BenchFlags& f) {
  std::vector<std::string> a = {bench::SelfExe(), "bench", "--sizes", f.sizes, "--hosts", "2", "--hosts-stage", "2",
                                "--poll-interval", std::to_string(f.poll_interval), "--file-dir", f.file_dir};
  auto add = [&](const char* name, int v) {
    if (f.app->count(name)) a.insert(a.end(), {name, std::to_string(v)});
  };
  add("--reps", f.reps), add("--warmup", f.warmup), add("--baseline-reps", f.baseline_reps), add("--notify-count", f.notify_count);
  if (f.quick) a.push_back("--quick");
  if (f.no_diagnostic_rows) a.push_back("--no-diagnostic-rows");
  for (const auto& part : f.only) a.insert(a.end(), {"--only", part});
  a.insert(a.end(), {"--delta-bytes", f.delta_bytes, "--delta-threads", std::to_string(f.delta_threads)});
  if (!f.delta_models.empty()) a.insert(a.end(), {"--delta-models", std::filesystem::absolute(f.delta_models).string()});
  if (!f.json_path.empty()) a.insert(a.end(), {"--json", std::filesystem::absolute(f.json_path).string()});
  if (!f.hosts_script.empty()) a.insert(a.end(), {"--hosts-script", f.hosts_script});
  if (!f.link_rate.empty()) a.insert(a.end(), {"--link-rate", f.link_rate});
  return a;
}

// --fanout: this command again inside fanout_hosts namespaces (producer in h1).
std::vector<std::string> FanoutInnerArgs(const BenchFlags& f) {
  std::vector<std::string> a = {bench::SelfExe(), "bench", "--fanout", "--sizes", f.sizes, "--hosts-stage",
                                std::to_string(f.fanout_hosts), "--fanout-hosts", std::to_string(f.fanout_hosts),
                                "--consumers", std::to_string(f.consumers)};
  if (f.app->count("--reps")) a.insert(a.end(), {"--reps", std::to_string(f.reps)});
  if (f.app->count("--warmup")) a.insert(a.end(), {"--warmup", std::to_string(f.warmup)});
  if (f.quick) a.push_back("--quick");
  if (!f.json_path.empty()) a.insert(a.end(), {"--json", std::filesystem::absolute(f.json_path).string()});
  if (!f.hosts_script.empty()) a.insert(a.end(), {"--hosts-script", f.hosts_script});
  if (!f.link_rate.empty()) a.insert(a.end(), {"--link-rate", f.link_rate});
  if (f.auto_place) a.insert(a.end(), {"--auto", "--max-children", std::to_string(f.max_children)});
  if (f.fanout_verify) a.push_back("--fanout-verify");
  return a;
}

Status CheckLinkRate(const BenchFlags& f) {
  if (!f.link_rate.empty() && !std::regex_match(f.link_rate, std::regex("[0-9]+(\\.[0-9]+)?[kmgt]?(bit|bps)")))
    return Status::InvalidArgument("--link-rate '" + f.link_rate + "': expected a tc rate such as 2gbit or 250mbps");
  if (!f.link_rate.empty() && !f.fanout && f.hosts != 2)
    return Status::InvalidArgument("--link-rate shapes the links between hosts: give --hosts 2 (or --fanout)");
  return Status::OK();
}

int RunFanoutBench(const BenchFlags& f) {
  if (f.hosts_stage == 0) return Fail("bench", bench::ExecInHosts(f.hosts_script, FanoutInnerArgs(f), f.fanout_hosts));
  auto config = MakeConfig(f);
  if (!config.ok()) return Fail("bench", config.status());
  bench::FanoutConfig fc;
  fc.base = *config;
  // A relay's and a consumer's first versions land in fresh memory (segments, buffers): untimed.
  if (f.app->count("--warmup") == 0) fc.base.warmup = f.quick ? 1 : 3;
  fc.base.log_path = fc.base.file_dir + ".log";
  fc.hosts = f.fanout_hosts;
  fc.consumers = f.consumers;
  fc.hosts_script = f.hosts_script;
  fc.link_rate = f.link_rate;
  fc.verify = f.fanout_verify;
  fc.max_children = f.max_children;
  Status st = f.auto_place ? bench::RunFanoutAuto(fc, f.json_path) : bench::RunFanout(fc, f.json_path);
  return st.ok() ? 0 : Fail("bench", st);
}

int RunGpuBench(const BenchFlags& f) {
  bench::GpuConfig c;
  std::string sizes = f.app->count("--sizes") ? f.sizes : "1.7G,8G";
  std::stringstream in(sizes);
  for (std::string item; std::getline(in, item, ',');) {
    auto bytes = ParseSize(item);
    if (!bytes.ok()) return Fail("bench", bytes.status());
    c.sizes.push_back(*bytes);
  }
  c.reps = f.reps;
  if (c.reps < 1) return Fail("bench", Status::InvalidArgument("--reps " + std::to_string(c.reps) + ": must be >= 1"));
  c.peer_bin = (std::filesystem::path(bench::SelfExe()).parent_path() / "viper_gpu_peer").string();
  c.wire_bin = (std::filesystem::path(bench::SelfExe()).parent_path() / "viper_wire_baseline").string();
  Status st = bench::RunGpu(c, f.json_path);
  return st.ok() ? 0 : Fail("bench", st);
}

int RunBench(const BenchFlags& f) {
  if (f.gpu) {
    if (f.fanout || f.subscribers != 0 || f.hosts != 1)
      return Fail("bench", Status::InvalidArgument("--gpu runs alone on one host: drop --fanout, --subscribers, --hosts"));
    return RunGpuBench(f);
  }
  if (f.fanout && f.subscribers != 0) return Fail("bench", Status::InvalidArgument("--fanout and --subscribers are two benchmarks: give one"));
  if (Status st = CheckLinkRate(f); !st.ok()) return Fail("bench", st);
  if ((f.auto_place || f.fanout_verify || f.app->count("--max-children")) && !f.fanout)
    return Fail("bench", Status::InvalidArgument("--auto, --max-children and --fanout-verify belong to --fanout: give it"));
  if (f.app->count("--max-children") && !f.auto_place)
    return Fail("bench", Status::InvalidArgument("--max-children bounds the tree the registry places: give --auto"));
  if (f.fanout) return RunFanoutBench(f);
  if (f.hosts != 1 && f.hosts != 2) return Fail("bench", Status::InvalidArgument("--hosts must be 1 or 2"));
  if (f.subscribers != 0 && f.hosts != 1)
    return Fail("bench", Status::InvalidArgument("--subscribers runs on one host: drop --hosts"));
  if (f.hosts == 2 && f.hosts_stage == 0) return Fail("bench", bench::ExecInHosts(f.hosts_script, InnerArgs(f)));
  auto config = MakeConfig(f);
  if (!config.ok()) return Fail("bench", config.status());
  if (f.subscribers != 0) {
    Status st = bench::RunLoad(*config, f.subscribers, f.json_path);
    return st.ok() ? 0 : Fail("bench", st);
  }
  config->link_rate = f.link_rate;
  if (f.hosts == 2)
    if (Status st = bench::ConfigureHosts(f.hosts_script, *config); !st.ok()) return Fail("bench", st);
  Status st = bench::Run(*config, f.json_path);
  return st.ok() ? 0 : Fail("bench", st);
}

ViperCommand bench_command(
    "bench", "Benchmark updates against warm memcpy and the file + polling baseline",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<BenchFlags>();
      f->app = &app;
      app.add_option("--sizes", f->sizes, "Snapshot sizes, e.g. 64Mi,600M,1.7G")->capture_default_str()->check(Text(256));
      app.add_flag("--quick", f->quick, "Fewer repetitions (2 warm-up, 2 timed, 1 baseline, 200 notifications) unless given");
      app.add_option("--reps", f->reps, "Timed updates per (mode, path)")->capture_default_str()->check(IntegerIn(1, 1000000));
      app.add_option("--warmup", f->warmup, "Untimed updates first (segments and buffers fault in)")
          ->capture_default_str()
          ->check(IntegerIn(0, 1000000));
      app.add_option("--baseline-reps", f->baseline_reps, "Timed file + poll updates per size")
          ->capture_default_str()
          ->check(IntegerIn(1, 1000000));
      app.add_option("--notify-count", f->notify_count, "Small versions for notification percentiles")
          ->capture_default_str()
          ->check(IntegerIn(1, 1000000));
      app.add_option("--poll-interval", f->poll_interval, "Baseline polling interval, seconds (TF Serving default 1)")
          ->capture_default_str()
          ->check(SecondsIn(0, 3600, /*lo_open=*/true));
      app.add_option("--file-dir", f->file_dir, "Where baseline files go (a disk, not tmpfs)")
          ->capture_default_str()
          ->check(PathText());
      app.add_flag("--no-diagnostic-rows", f->no_diagnostic_rows,
                   "Skip the diagnostic rows: the sync row whose consumer checksum pass is flipped (verify-local on one host, no-verify across hosts) and, across hosts, each mode with the producer's cut-through off");
      app.add_option("--json", f->json_path, "Also write every figure to this JSON file")->check(NewFile());
      app.add_option("--hosts", f->hosts, "1: one host; 2: producer and consumer in two network namespaces (root)")
          ->capture_default_str()
          ->check(IntegerIn(1, 2));
      app.add_option("--subscribers", f->subscribers,
                     "Only the load benchmark: notification p99 and memory with this many subscriber processes on one node")
          ->check(IntegerIn(0, 4096));
      app.add_option("--hosts-script", f->hosts_script, "scripts/hosts.sh (default: found beside the build)")->check(ReadableFile());
      app.add_option("--hosts-stage", f->hosts_stage, "(internal: the stage of --hosts 2 and --fanout)")
          ->group("Internal")  // not "": CLI11 names a hidden option "" in its errors
          ->check(IntegerIn(0, 64));
      app.add_flag("--gpu", f->gpu,
                   "Only the GPU benchmark: publish -> live on one GPU in another process (CUDA IPC) against one "
                   "device-to-device copy, GPU -> pinned -> GPU staging, the training stall (--sizes default 1.7G,8G)");
      app.add_flag("--fanout", f->fanout,
                    "Only the fan-out benchmark: one producer, --consumers on --fanout-hosts network namespaces, "
                    "with and without a chain of relays (root; first size of --sizes)");
      app.add_option("--fanout-hosts", f->fanout_hosts, "--fanout: hosts (the producer's is h1)")
          ->capture_default_str()
          ->check(IntegerIn(2, 64));
      app.add_flag("--auto", f->auto_place,
                   "--fanout: no upstream written down: a redis-server in h1 is the registry, every relay is placed by it "
                   "(viper serve --registry --relay-model); then a relay with a child is killed mid-transfer (heal)");
      app.add_option("--max-children", f->max_children, "--fanout --auto: children each relay takes in the tree")
          ->capture_default_str()
          ->check(IntegerIn(1, 1024));
      app.add_flag("--fanout-verify", f->fanout_verify,
                   "--fanout: every consumer also hashes the version it maps and reports its checksum (bit-exact; one "
                   "xxh3 pass each)");
      app.add_option("--consumers", f->consumers, "--fanout: consumers, a multiple of --fanout-hosts")
          ->capture_default_str()
          ->check(IntegerIn(1, 4096));
      app.add_option("--link-rate", f->link_rate,
                     "--fanout, --hosts 2: shape every host's link to this rate (tc, e.g. 2gbit): the link, not the shared CPUs, "
                     "limits")
          ->check(Text(32));
      app.add_option("--only", f->only,
                     "Run just this part (repeatable), without the sizes: delta, delta-chain (a delta through two relays)")
          ->check(OneOf({"delta", "delta-chain"}));
      app.add_option("--delta-bytes", f->delta_bytes, "delta part: size of the bf16 model of case (a)")
          ->capture_default_str()
          ->check(Text(32));
      app.add_option("--delta-threads", f->delta_threads, "delta part: the producer node's encoder threads")
          ->capture_default_str()
          ->check(IntegerIn(1, 256));
      app.add_option("--delta-models", f->delta_models,
                     "delta part: directory of bench/delta_models.py's files (made there if missing)")
          ->check(PathText());
      return [f] { return RunBench(*f); };
    },
    70);

}  // namespace
}  // namespace viper::cli
