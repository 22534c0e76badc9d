// `viper bench --fanout` (see fanout.h).
#include "harness/fanout.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "api/client.h"
#include "harness/bench.h"
#include "harness/fanout_run.h"
#include "harness/measure.h"
#include "harness/peer.h"
#include "viper/node.h"
#include "viper/relay.h"
#include "viper/units.h"

namespace viper::bench {

using nlohmann::json;
using std::chrono::milliseconds;

std::vector<std::string> FanoutRun::In(int host) const {
  if (host == 1) return {};
  return {script, "exec", "h" + std::to_string(host), "--"};
}

Result<Reporter> StartReporter(const FanoutRun& run, int host, std::vector<std::string> args) {
  Config c = run.config.base;
  c.consumer_prefix = run.In(host);
  json ready;
  VIPER_ASSIGN_OR_RETURN(auto child, StartPeer(c, std::move(args), &ready));
  Reporter r;
  r.child = std::move(child);
  r.address = ready.value("address", "");
  r.host = host;
  r.pid = ready.value("pid", 0);
  return r;
}

Result<Reporter> SubscribePeer(const FanoutRun& run, int host, const std::string& connect, const std::string& path) {
  std::vector<std::string> args = {"subscribe", "--connect", connect, "--model", "fan", "--path", path};
  if (run.config.verify) args.push_back("--verify-local");
  return StartReporter(run, host, std::move(args));
}

namespace {

// A fanout-host peer on `host` whose node relays from `upstream`, with its share of consumers.
Result<Reporter> RelayHost(const FanoutRun& run, int host, const std::string& upstream, bool pipelined) {
  std::vector<std::string> args = {"fanout-host", "--listen", run.ip[host] + ":0", "--upstream", upstream,
                                   "--consumers", std::to_string(run.per_host), "--path", "map"};
  if (!pipelined) args.push_back("--no-pipeline");
  return StartReporter(run, host, std::move(args));
}

}  // namespace

Status CollectLive(Reporter& r, uint64_t v, uint64_t checksum, std::vector<int64_t>& live, Row& row, milliseconds timeout) {
  auto moved = [&r](const json& e) {
    if (e.value("event", "") != "upstream") return;
    r.upstream = e.value("upstream", "");
    r.upstream_ns = e.value("t_ns", int64_t{0});
    r.joins = e.value("joins", uint64_t{0});
  };
  VIPER_ASSIGN_OR_RETURN(json j, WaitVersion(*r.child, v, timeout, moved));
  std::vector<uint64_t> sums;
  if (j["live_ns"].is_array()) {
    for (const auto& t : j["live_ns"]) live.push_back(t.get<int64_t>());
    for (const auto& p : j["paths"]) row.paths.insert(p.get<std::string>());
    for (const auto& c : j.value("checksums", json::array())) sums.push_back(c.get<uint64_t>());
  } else {
    live.push_back(j["live_ns"].get<int64_t>());
    row.paths.insert(j.value("path", ""));
    if (j.contains("checksum")) sums.push_back(j["checksum"].get<uint64_t>());
  }
  for (uint64_t sum : sums) {
    row.checksums_checked++;
    row.checksums_wrong += sum != checksum;
  }
  return Status::OK();
}

namespace {

// CPU seconds (user + system) used so far by process `pid` and every live descendant: the producer
// (this process), its consumers and the hosts' relays and consumers are all below this process.
double TreeCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i)  // fields 14 and 15: utime, stime
    if (i >= 14) ticks += std::stod(f);
  double seconds = ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream children(task.path() / "children");
    for (pid_t child; children >> child;) seconds += TreeCpuSeconds(child);
  }
  return seconds;
}

}  // namespace

double BytesSent(const std::string& address) {
  ClientOptions co;
  co.connect = address;
  co.name = "viper-bench-fanout";
  auto c = Client::Connect(co);
  if (!c.ok()) return -1;
  auto counters = (*c)->Stats();
  return counters.ok() ? static_cast<double>((*counters)["bytes_sent"]) : -1;
}

// The producer's send of the last chunks completes a little after its receiver has them: wait
// until the counter settles before reading it for a total.
uint64_t SettledBytesSent(Publisher& pub) {
  uint64_t last = pub.node().stats().bytes_sent;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    uint64_t now = pub.node().stats().bytes_sent;
    if (now == last) return now;
    last = now;
  }
  return last;
}

uint64_t LatestChecksum(FanoutRun& run) {
  auto latest = run.pub->node().Latest("fan");
  return latest ? latest->checksum : 0;
}

Result<Row> RunRow(FanoutRun& run, std::string name, std::vector<Reporter>& reporters) {
  Row row;
  row.name = std::move(name);
  const Config& c = run.config.base;
  std::vector<double> relays_before;
  uint64_t before = 0;
  double cpu_before = 0;
  for (int i = 0; i < c.warmup + c.reps; ++i) {
    if (i == c.warmup) {
      before = SettledBytesSent(*run.pub);
      cpu_before = TreeCpuSeconds(::getpid());
      for (auto& r : reporters)
        if (!r.address.empty()) relays_before.push_back(BytesSent(r.address));
    }
    int64_t t0 = WallClockNs();
    VIPER_ASSIGN_OR_RETURN(PublishResult pr, run.pub->Publish(run.model.tensors, AtStep(i)));
    if (pr.bytes != run.bytes) return Status::Internal("published " + std::to_string(pr.bytes) + " bytes, expected " + std::to_string(run.bytes));
    const uint64_t checksum = LatestChecksum(run);
    std::vector<int64_t> live;
    std::vector<int> hosts;
    for (auto& r : reporters) {
      VIPER_RETURN_IF_ERROR(CollectLive(r, pr.version, checksum, live, row, TransferTimeout(pr.bytes)));
      hosts.resize(live.size(), r.host);
    }
    row.consumers = static_cast<int>(live.size());
    row.consumer_host = hosts;
    if (i < c.warmup) continue;
    row.first.Add(Sec(t0, *std::min_element(live.begin(), live.end())));
    row.last.Add(Sec(t0, *std::max_element(live.begin(), live.end())));
    row.published_ns.push_back(t0);
    row.live_ns.push_back(std::move(live));
  }
  row.cpu_s = (TreeCpuSeconds(::getpid()) - cpu_before) / c.reps;
  double updates = static_cast<double>(c.reps) * static_cast<double>(run.bytes);
  row.egress = static_cast<double>(SettledBytesSent(*run.pub) - before) / updates;
  size_t k = 0;
  for (auto& r : reporters) {
    if (r.address.empty()) continue;
    double now = BytesSent(r.address), then = relays_before[k++];
    row.relay_egress.push_back(now < 0 || then < 0 ? -1 : (now - then) / updates);
  }
  return row;
}

namespace {
Result<Row> RunRowAndStop(FanoutRun& run, std::string name, std::vector<Reporter> reporters) {
  auto row = RunRow(run, std::move(name), reporters);
  for (auto& r : reporters) r.child->Stop();
  return row;
}
}  // namespace

Result<Row> SingleRow(FanoutRun& run) {
  std::vector<Reporter> reporters;
  VIPER_ASSIGN_OR_RETURN(Reporter r, SubscribePeer(run, 2, run.pub->address(), "remote"));
  reporters.push_back(std::move(r));
  return RunRowAndStop(run, "single", std::move(reporters));
}

namespace {

// Every consumer on the producer's node: h1's map its segments, the others fetch remote.
Result<Row> DirectRow(FanoutRun& run) {
  std::vector<Reporter> reporters;
  for (int host = 1; host <= run.config.hosts; ++host)
    for (int i = 0; i < run.per_host; ++i) {
      VIPER_ASSIGN_OR_RETURN(Reporter r, SubscribePeer(run, host, run.pub->address(), host == 1 ? "map" : "remote"));
      reporters.push_back(std::move(r));
    }
  return RunRowAndStop(run, "direct", std::move(reporters));
}

// h1's consumers map the producer's node; h2 relays from h1, h3 from h2, ...
Result<Row> ChainRow(FanoutRun& run, bool pipelined) {
  std::vector<Reporter> reporters;
  for (int i = 0; i < run.per_host; ++i) {
    VIPER_ASSIGN_OR_RETURN(Reporter r, SubscribePeer(run, 1, run.pub->address(), "map"));
    reporters.push_back(std::move(r));
  }
  std::string upstream = run.pub->address();
  for (int host = 2; host <= run.config.hosts; ++host) {
    VIPER_ASSIGN_OR_RETURN(Reporter r, RelayHost(run, host, upstream, pipelined));
    upstream = r.address;
    reporters.push_back(std::move(r));
  }
  return RunRowAndStop(run, pipelined ? "chain" : "chain,saf", std::move(reporters));
}

// --------------------------------------------------------------------------- the wire

}  // namespace

double Wire::ChainS(uint64_t bytes, bool verify) const {
  const auto& v = verify ? chain_verify : chain;
  return v.empty() ? 0 : Seconds(bytes, *std::min_element(v.begin(), v.end()));
}

json Wire::Json(uint64_t bytes) const {
  return {{"single_gbps", single}, {"chain_gbps", chain}, {"single_verify_gbps", single_verify},
          {"chain_verify_gbps", chain_verify}, {"single_s", SingleS(bytes, false)}, {"chain_s", ChainS(bytes, false)},
          {"single_verify_s", SingleS(bytes, true)}, {"chain_verify_s", ChainS(bytes, true)}, {"error", error}};
}

namespace {

TcpEnds Hop(const FanoutRun& run, int from) {
  const Config& c = run.config.base;
  return TcpEnds{c.wire_bin, c.log_path, run.In(from + 1), run.ip[from + 1], run.In(from)};
}

}  // namespace

void MeasureWire(const FanoutRun& run, const std::string& sink, Wire& w) {
  const bool verify = !sink.empty();
  std::vector<double>& single = verify ? w.single_verify : w.single;
  std::vector<double>& chain = verify ? w.chain_verify : w.chain;
  std::string& error = w.error;
  int reps = std::max(run.config.base.reps, 3);
  if (Status st = MeasureTcpStream(Hop(run, 1), run.bytes, reps, sink, single); !st.ok()) error += st.message() + "; ";
  std::vector<std::future<std::pair<Status, std::vector<double>>>> hops;
  for (int from = 1; from < run.config.hosts; ++from)
    hops.push_back(std::async(std::launch::async, [&run, from, reps, sink] {
      std::vector<double> gbps;
      Status st = MeasureTcpStream(Hop(run, from), run.bytes, reps, sink, gbps);
      return std::make_pair(st, gbps);
    }));
  for (auto& h : hops) {
    auto [st, gbps] = h.get();
    if (!st.ok()) error += st.message() + "; ";
    chain.push_back(Median(gbps));
  }
}

// --------------------------------------------------------------------------- report

std::string Ms(double s) { return fmt::format("{:.0f}", s * 1e3); }

namespace {

void PrintRows(const FanoutRun& run, const std::vector<Row>& rows, const Wire& w) {
  const auto& cfg = run.config;
  std::printf("\n== fan-out: snapshot %s (NT3-like), %d consumers on %d hosts (%d each), producer in h1, links %s\n",
              HumanBytes(static_cast<double>(run.bytes)).c_str(), cfg.consumers, cfg.hosts, run.per_host,
              cfg.link_rate.empty() ? "unshaped (veth)" : ("shaped to " + cfg.link_rate + " each way out of every host").c_str());
  std::printf("   wire h1 -> h2 alone: %s ms (%.2f GB/s); %d streams at once along the chain, the slowest: %s ms (%.2fx)\n",
              Ms(w.SingleS(run.bytes, false)).c_str(), Median(w.single), cfg.hosts - 1, Ms(w.ChainS(run.bytes, false)).c_str(),
              w.ChainS(run.bytes, false) / std::max(w.SingleS(run.bytes, false), 1e-9));
  std::printf("   the same landed + xxh3 (a verified receive): %s ms alone; %s ms at once (%.2fx)%s%s\n",
              Ms(w.SingleS(run.bytes, true)).c_str(), Ms(w.ChainS(run.bytes, true)).c_str(),
              w.ChainS(run.bytes, true) / std::max(w.SingleS(run.bytes, true), 1e-9), w.error.empty() ? "" : "  ERROR: ",
              w.error.c_str());
  double single = rows.front().last.median();
  const double cpus = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("   %-10s %9s %9s %9s %8s %8s %9s %15s  %s\n", "row", "consumers", "first ms", "last ms", "x single", "cpu s",
              "cpu floor", "producer egress", "relays' egress (sizes/update)");
  for (const auto& r : rows) {
    std::string relays;
    for (double e : r.relay_egress) relays += fmt::format("{}{:.2f}", relays.empty() ? "" : " ", e);
    std::string paths;
    for (const auto& p : r.paths) paths += (paths.empty() ? "" : ",") + p;
    std::printf("   %-10s %9d %9s %9s %8.2f %8.2f %9s %15.2f  %s  [%s]\n", r.name.c_str(), r.consumers,
                Ms(r.first.median()).c_str(), Ms(r.last.median()).c_str(), r.last.median() / single, r.cpu_s,
                Ms(r.cpu_s / cpus).c_str(), r.egress, relays.empty() ? "-" : relays.c_str(), paths.c_str());
  }
  std::printf("   (medians of %d timed updates after %d warm-up; egress counted by the nodes, NodeStats::bytes_sent;\n"
              "    cpu s: user + system CPU of every process of the row per update; cpu floor: that over the %.0f CPUs,\n"
              "    the least wall time the row's work can take here whatever its schedule)\n",
              cfg.base.reps, cfg.base.warmup, cpus);
}

}  // namespace

json RowJson(const Row& r) {
  return {{"name", r.name}, {"consumers", r.consumers}, {"first_s", r.first.Json()}, {"last_s", r.last.Json()},
          {"cpu_s_per_update", r.cpu_s},
          {"producer_egress_sizes", r.egress}, {"relay_egress_sizes", r.relay_egress},
          {"paths", std::vector<std::string>(r.paths.begin(), r.paths.end())},
          {"checksums_checked", r.checksums_checked}, {"checksums_wrong", r.checksums_wrong}};
}

Status Setup(FanoutRun& run) {
  FanoutConfig& cfg = run.config;
  if (cfg.hosts < 2 || cfg.consumers < cfg.hosts || cfg.consumers % cfg.hosts != 0)
    return Status::InvalidArgument("--consumers must be a multiple of --fanout-hosts (>= 2)");
  run.per_host = cfg.consumers / cfg.hosts;
  VIPER_ASSIGN_OR_RETURN(run.script, FindHostsScript(cfg.hosts_script));
  run.ip.assign(1, "");
  for (int k = 1; k <= cfg.hosts; ++k) {
    VIPER_ASSIGN_OR_RETURN(std::string ip, HostAddress("h" + std::to_string(k)));
    run.ip.push_back(ip);
  }
  cfg.base.listen = run.ip[1] + ":0";
  VIPER_RETURN_IF_ERROR(ShapeLinks(run.script, cfg.hosts, cfg.link_rate, cfg.base.log_path));
  VIPER_ASSIGN_OR_RETURN(run.model, MakeNt3(cfg.base.sizes.front().second));
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout, SnapshotLayout::Make(run.model.specs));
  run.bytes = layout.total_bytes();  // what each publish sends (checked against PublishResult below)
  PublisherOptions po = BenchPublisherOptions(cfg.base, "fan", PublishMode::kSync, DeltaMode::kOff);
  po.node.registry = cfg.registry;  // "": none (the configured rows)
  VIPER_ASSIGN_OR_RETURN(run.pub, Publisher::Start(po));
  return Status::OK();
}

Status RunFanout(FanoutConfig config, const std::string& json_path) {
  FanoutRun run;
  run.config = std::move(config);
  VIPER_RETURN_IF_ERROR(Setup(run));
  Wire w;
  MeasureWire(run, "", w);
  MeasureWire(run, "--verify", w);
  std::vector<Row> rows;
  std::function<Result<Row>(FanoutRun&)> parts[] = {SingleRow, DirectRow, [](FanoutRun& r) { return ChainRow(r, false); },
                                              [](FanoutRun& r) { return ChainRow(r, true); }};
  for (auto& part : parts) {
    VIPER_ASSIGN_OR_RETURN(Row row, part(run));
    rows.push_back(std::move(row));
  }
  // The wire again after the rows (not with --quick): drift of the shared machine lands in the medians.
  if (!run.config.base.quick) {
    MeasureWire(run, "", w);
    MeasureWire(run, "--verify", w);
  }
  PrintRows(run, rows, w);
  Report report;
  const Row& chain = rows.back();
  report.Target("fan-out: producer egress per update, model sizes", chain.egress, 1.5, /*at_most=*/true);
  report.Target("fan-out: last consumer live / single consumer", chain.last.median() / rows.front().last.median(), 2.0,
                /*at_most=*/true);
  json targets = report.PrintTargets();
  if (json_path.empty()) return Status::OK();
  json rows_json = json::array();
  for (const auto& r : rows) rows_json.push_back(RowJson(r));
  json out = {{"fanout",
               {{"bytes", run.bytes}, {"hosts", run.config.hosts}, {"consumers", run.config.consumers},
                {"link_rate", run.config.link_rate},
                {"rows", rows_json},
                {"wire", w.Json(run.bytes)},
                {"targets", targets}}}};
  std::ofstream(json_path) << out.dump(2) << "\n";
  return Status::OK();
}

// --------------------------------------------------------------------------- the host peer

namespace {

// Consumers' lines gathered by version; a version is reported once every consumer has it.
struct Gather {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::map<int, json>> by_version;  // version -> consumer index -> its line
  bool stop = false;
  Status error;
};

void ReadConsumer(LineChild& child, int index, Gather& g) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(g.mu);
      if (g.stop) return;
    }
    auto line = child.ReadLine(milliseconds(200));
    if (!line.ok() && line.status().code() == StatusCode::kTimeout) continue;
    std::lock_guard<std::mutex> lock(g.mu);
    json j = line.ok() ? json::parse(*line, nullptr, false) : json();
    if (!line.ok() || j.is_discarded()) {
      if (g.error.ok()) g.error = line.ok() ? Status::Corruption("consumer printed: " + *line) : line.status();
      g.stop = true;
    } else {
      uint64_t version = j.value("version", uint64_t{0});  // before the move below: `=` evaluates its right side first
      g.by_version[version][index] = std::move(j);
    }
    g.cv.notify_all();
  }
}

// A registry-placed relay's moves, as events on stdout: polled, so a move is seen within 5 ms.
void WatchUpstream(const Relay& relay, const std::string& model, Gather& g) {
  std::string upstream;
  uint64_t joins = 0;
  std::unique_lock<std::mutex> lock(g.mu);
  while (!g.cv.wait_for(lock, milliseconds(5), [&g] { return g.stop; })) {
    RelayStats stats = relay.stats();
    std::string now = stats.connected_to[model];
    if (now == upstream && stats.joins == joins) continue;
    upstream = now, joins = stats.joins;
    PrintLine({{"event", "upstream"}, {"upstream", upstream}, {"joins", joins}, {"t_ns", WallClockNs()}});
  }
}

Result<std::unique_ptr<Relay>> StartRelay(Node& node, const FanoutHostOptions& o) {
  RelayOptions ro;
  ro.upstream = o.upstream;
  ro.registry = o.registry;
  ro.max_children = static_cast<uint32_t>(o.max_children);
  ro.heartbeat = node.options().registry_heartbeat;
  ro.models = {o.model};
  ro.pipelined = o.pipelined;
  return Relay::Start(node, ro);
}

}  // namespace

Status RunFanoutHost(const FanoutHostOptions& o) {
  NodeOptions no;
  no.listen = o.listen;
  no.recover = false;
  no.insecure = true;          // a namespace address, reachable only inside the bench's own namespaces
  no.delta = DeltaMode::kOff;  // full copies: see RunFanout
  no.segment_prefix = "viperfan" + std::to_string(::getpid());
  no.registry = o.registry;
  VIPER_ASSIGN_OR_RETURN(auto node, Node::Start(no));
  std::unique_ptr<Relay> relay;
  if (!o.upstream.empty() || !o.registry.empty()) {
    VIPER_ASSIGN_OR_RETURN(relay, StartRelay(*node, o));
  }
  const std::string connect = relay ? node->address() : o.connect;
  std::vector<std::unique_ptr<LineChild>> consumers;
  for (int i = 0; i < o.consumers; ++i) {  // our children: they share this host's mount namespace
    std::vector<std::string> argv = {SelfExe(), "bench-peer", "subscribe", "--connect", connect, "--model", o.model, "--path", o.path};
    if (o.verify_local) argv.push_back("--verify-local");
    VIPER_ASSIGN_OR_RETURN(auto child, LineChild::Start(argv));
    VIPER_ASSIGN_OR_RETURN(std::string ready, child->ReadLine(milliseconds(30000)));
    if (ready.find("\"ready\":true") == std::string::npos) return Status::Internal("consumer did not report ready: " + ready);
    consumers.push_back(std::move(child));
  }
  Gather g;
  std::vector<std::thread> readers;
  for (size_t i = 0; i < consumers.size(); ++i)
    readers.emplace_back([&g, &consumers, i] { ReadConsumer(*consumers[i], static_cast<int>(i), g); });
  std::thread stdin_watch([&g] {
    StdinClosed(-1);
    std::lock_guard<std::mutex> lock(g.mu);
    g.stop = true;
    g.cv.notify_all();
  });
  PrintLine({{"ready", true}, {"address", node->address()}, {"host_key", LocalHostKey()}, {"pid", ::getpid()}});
  std::thread upstream_watch;
  if (relay && !o.registry.empty()) upstream_watch = std::thread([&] { WatchUpstream(*relay, o.model, g); });
  {
    std::unique_lock<std::mutex> lock(g.mu);
    while (!g.stop) {
      g.cv.wait(lock);
      for (auto it = g.by_version.begin(); it != g.by_version.end();) {
        if (it->second.size() < consumers.size()) {
          ++it;
          continue;
        }
        json live = json::array(), paths = json::array(), sums = json::array();
        for (const auto& [index, j] : it->second) {
          live.push_back(j["live_ns"]), paths.push_back(j.value("path", ""));
          if (j.contains("checksum")) sums.push_back(j["checksum"]);
        }
        PrintLine({{"version", it->first}, {"live_ns", live}, {"paths", paths}, {"checksums", sums}});
        it = g.by_version.erase(it);
      }
    }
  }
  stdin_watch.join();  // stop was set by it, or by a reader's error (then stdin closes with the bench)
  if (upstream_watch.joinable()) upstream_watch.join();
  for (auto& t : readers) t.join();
  consumers.clear();
  relay.reset();
  node.reset();
  return g.error;
}

}  // namespace viper::bench
