// `viper bench --fanout --auto` (see fanout.h): the fan-out whose tree the registry arranges.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "harness/bench.h"
#include "harness/fanout_run.h"
#include "harness/measure.h"
#include "harness/section.h"
#include "viper/node.h"
#include "viper/registry.h"
#include "viper/units.h"

namespace viper::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// --------------------------------------------------------------------------- the registry

// A redis-server in h1 on h1's address: every host reaches it, nothing outside the hosts does (they
// have no route out; hence no protected mode, which would refuse them without a password). No
// persistence; stopped with the run.
struct Redis {
  std::unique_ptr<LineChild> child;
  std::string url;
};

Result<Redis> StartRedis(const std::string& ip, const std::string& log_path) {
  Status why = Status::Unavailable("redis-server did not start");
  for (int attempt = 0; attempt < 5; ++attempt) {
    VIPER_ASSIGN_OR_RETURN(uint16_t port, FreeTcpPort(ip));
    Redis r;
    r.url = "redis://" + ip + ":" + std::to_string(port);
    VIPER_ASSIGN_OR_RETURN(r.child, LineChild::Start({"redis-server", "--bind", ip, "--port", std::to_string(port), "--save", "",
                                                      "--appendonly", "no", "--dir", "/tmp", "--daemonize", "no",
                                                      "--protected-mode", "no"},
                                                     log_path));
    VIPER_ASSIGN_OR_RETURN(auto registry, OpenRegistry(r.url));
    for (int i = 0; i < 50; ++i) {
      auto models = registry->Models();
      if (models.ok()) return r;
      why = models.status();
      std::this_thread::sleep_for(milliseconds(100));
    }
    r.child->Stop(milliseconds(200));
  }
  return why.WithContext("--fanout --auto needs redis-server in PATH (the registry); see " + log_path);
}

// --------------------------------------------------------------------------- the placed tree

// Consumers of h1 map the producer's node; every other host runs a node whose relay names only the
// registry, with its host's consumers mapping it. The relays start one after another and the
// producer holds versions already (the single row's): each joins as it starts. (Joins that race
// for one slot are tests/registry/placement_test's.)
Result<std::vector<Reporter>> StartPlacedHosts(const FanoutRun& run, const std::string& registry) {
  std::vector<Reporter> reporters;
  for (int i = 0; i < run.per_host; ++i) {
    VIPER_ASSIGN_OR_RETURN(Reporter r, SubscribePeer(run, 1, run.pub->address(), "map"));
    reporters.push_back(std::move(r));
  }
  for (int host = 2; host <= run.config.hosts; ++host) {
    std::vector<std::string> args = {"fanout-host", "--listen", run.ip[host] + ":0", "--registry", registry,
                                     "--max-children", std::to_string(run.config.max_children), "--consumers",
                                     std::to_string(run.per_host), "--path", "map"};
    if (run.config.verify) args.push_back("--verify-local");
    VIPER_ASSIGN_OR_RETURN(Reporter r, StartReporter(run, host, std::move(args)));
    reporters.push_back(std::move(r));
  }
  return reporters;
}

// "h1" for the producer's node, "hK" for host K's relay, the address otherwise.
std::string HostOf(const FanoutRun& run, const std::vector<Reporter>& reporters, const std::string& address) {
  if (address == run.pub->address()) return "h1";
  for (const auto& r : reporters)
    if (!r.address.empty() && r.address == address) return "h" + std::to_string(r.host);
  return address.empty() ? "none" : address;
}

// Each relay's host and the host of the node it relays from now: {"h3": "h2", ...}.
json Tree(const FanoutRun& run, const std::vector<Reporter>& reporters) {
  json tree = json::object();
  for (const auto& r : reporters)
    if (!r.address.empty()) tree["h" + std::to_string(r.host)] = HostOf(run, reporters, r.upstream);
  return tree;
}

std::string TreeText(const json& tree) {
  std::string out;
  for (const auto& [child, parent] : tree.items()) out += (out.empty() ? "" : ", ") + child + " <- " + parent.get<std::string>();
  return out;
}

// Bytes per second of a tc rate ("2gbit", "250mbps", "1.5gbit"): SI multiples, bit or bytes.
double TcRateBytes(const std::string& rate) {
  size_t used = 0;
  double v = std::stod(rate, &used);
  std::string unit = rate.substr(used);
  double mult = 1;
  if (!unit.empty() && std::string("kmgt").find(unit[0]) != std::string::npos) {
    mult = unit[0] == 'k' ? 1e3 : unit[0] == 'm' ? 1e6 : unit[0] == 'g' ? 1e9 : 1e12;
    unit = unit.substr(1);
  }
  return v * mult / (unit == "bit" ? 8.0 : 1.0);
}

// Each consumer behind a link (not h1's, which map the producer's node): bytes over the time from
// publish to live, the median over the timed updates, in GB/s.
std::vector<double> ReceiveRates(const FanoutRun& run, const Row& row) {
  std::vector<double> rates;
  for (size_t c = 0; c < row.consumer_host.size(); ++c) {
    if (row.consumer_host[c] == 1) continue;
    std::vector<double> gbps;
    for (size_t u = 0; u < row.live_ns.size(); ++u)
      gbps.push_back(static_cast<double>(run.bytes) / Sec(row.published_ns[u], row.live_ns[u][c]) / 1e9);
    rates.push_back(Median(gbps));
  }
  return rates;
}

// --------------------------------------------------------------------------- the heal

struct Heal {
  std::string victim;                  // host of the killed relay
  pid_t victim_pid = 0;
  std::vector<std::string> orphans;    // hosts of its children
  json tree_before, tree_after;
  double kill_after_s = 0;             // publish -> kill
  double rejoin_s = 0;                 // kill -> the last orphan relaying from its new parent
  double live_s = 0;                   // kill -> the last surviving consumer live on the version in flight
  double undisturbed_s = 0;            // the placed row's median publish -> last consumer live
  double egress_in_flight = 0, egress_next = 0;  // producer's, in model sizes
  double next_last_s = 0;              // the version after: publish -> last consumer live
  int survivors = 0;                   // consumers that had both versions
  double heal_s() const { return std::max(rejoin_s, live_s); }
};

// Reads `r`'s lines until its relay relays from a node other than `dead` after `after_ns`.
Status WaitMoved(Reporter& r, const std::string& dead, int64_t after_ns, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (r.upstream.empty() || r.upstream == dead || r.upstream_ns <= after_ns) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return Status::Timeout("h" + std::to_string(r.host) + "'s relay did not move away from its killed parent " + dead);
    VIPER_ASSIGN_OR_RETURN(std::string line, r.child->ReadLine(left));
    json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == "upstream") {
      r.upstream = e.value("upstream", "");
      r.upstream_ns = e.value("t_ns", int64_t{0});
      r.joins = e.value("joins", uint64_t{0});
    }
  }
  return Status::OK();
}

// The relay nearest the root among those with a child.
Result<size_t> PickVictim(const FanoutRun& run, const std::vector<Reporter>& reporters) {
  auto depth = [&](const Reporter& r) {
    int d = 0;
    std::string at = r.upstream;
    for (; d < 64 && at != run.pub->address() && !at.empty(); ++d) {
      auto up = std::find_if(reporters.begin(), reporters.end(), [&](const Reporter& x) { return x.address == at; });
      at = up == reporters.end() ? "" : up->upstream;
    }
    return d;
  };
  std::optional<size_t> best;
  for (size_t i = 0; i < reporters.size(); ++i) {
    if (reporters[i].address.empty()) continue;
    bool parent = std::any_of(reporters.begin(), reporters.end(), [&](const Reporter& x) { return x.upstream == reporters[i].address; });
    if (parent && (!best || depth(reporters[i]) < depth(reporters[*best]))) best = i;
  }
  if (!best) return Status::FailedPrecondition("no relay has a child to orphan: give --fanout-hosts 3 or more");
  return *best;
}

// Removes the killed node's segments (it could not: kill -9), once its consumers are gone.
void RemoveSegments(pid_t pid) {
  const std::string prefix = "viperfan" + std::to_string(pid) + ".";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().starts_with(prefix)) std::filesystem::remove(e.path(), ec);
}

// Publishes step `step`, kills the victim while the version is on its way, then waits for every
// surviving consumer to have it and for the orphans to relay from their new parents; then one more
// version through the healed tree.
Result<Heal> RunHeal(FanoutRun& run, std::vector<Reporter>& reporters, const Row& placed, int step) {
  Heal h;
  VIPER_ASSIGN_OR_RETURN(size_t victim, PickVictim(run, reporters));
  const std::string dead = reporters[victim].address;
  h.victim = "h" + std::to_string(reporters[victim].host);
  h.tree_before = Tree(run, reporters);
  h.undisturbed_s = placed.last.median();
  std::vector<size_t> orphans;
  for (size_t i = 0; i < reporters.size(); ++i)
    if (reporters[i].upstream == dead) orphans.push_back(i), h.orphans.push_back("h" + std::to_string(reporters[i].host));
  Row scratch;
  uint64_t before = SettledBytesSent(*run.pub);
  int64_t t0 = WallClockNs();
  VIPER_ASSIGN_OR_RETURN(PublishResult pr, run.pub->Publish(run.model.tensors, AtStep(step)));
  // Mid-transfer: 40% of the undisturbed time after the publish began.
  auto kill_at = std::chrono::nanoseconds(static_cast<int64_t>(0.4 * h.undisturbed_s * 1e9) - (WallClockNs() - t0));
  if (kill_at.count() > 0) std::this_thread::sleep_for(kill_at);
  int64_t killed_ns = WallClockNs();
  pid_t pid = reporters[victim].pid > 0 ? reporters[victim].pid : reporters[victim].child->pid();
  h.victim_pid = pid;
  if (::kill(pid, SIGKILL) != 0) return Status::FromErrno("kill -9 the relay of " + h.victim);
  h.kill_after_s = Sec(t0, killed_ns);
  const uint64_t checksum = LatestChecksum(run);
  std::vector<int64_t> live;
  for (size_t i = 0; i < reporters.size(); ++i)
    if (i != victim) VIPER_RETURN_IF_ERROR(CollectLive(reporters[i], pr.version, checksum, live, scratch, TransferTimeout(pr.bytes)));
  for (size_t i : orphans) VIPER_RETURN_IF_ERROR(WaitMoved(reporters[i], dead, killed_ns, milliseconds(30000)));
  h.egress_in_flight = static_cast<double>(SettledBytesSent(*run.pub) - before) / static_cast<double>(run.bytes);
  for (int64_t t : live) h.live_s = std::max(h.live_s, Sec(killed_ns, t));
  for (size_t i : orphans) h.rejoin_s = std::max(h.rejoin_s, Sec(killed_ns, reporters[i].upstream_ns));
  // The killed host's consumers exit when its pipes close; then its segments go.
  reporters[victim].child->Stop(milliseconds(2000));
  RemoveSegments(pid);
  reporters.erase(reporters.begin() + static_cast<std::ptrdiff_t>(victim));
  h.tree_after = Tree(run, reporters);
  // One more version through the healed tree.
  before = SettledBytesSent(*run.pub);
  t0 = WallClockNs();
  VIPER_ASSIGN_OR_RETURN(pr, run.pub->Publish(run.model.tensors, AtStep(step + 1)));
  const uint64_t next_checksum = LatestChecksum(run);
  std::vector<int64_t> next;
  for (auto& r : reporters) VIPER_RETURN_IF_ERROR(CollectLive(r, pr.version, next_checksum, next, scratch, TransferTimeout(pr.bytes)));
  h.egress_next = static_cast<double>(SettledBytesSent(*run.pub) - before) / static_cast<double>(run.bytes);
  h.next_last_s = Sec(t0, *std::max_element(next.begin(), next.end()));
  h.survivors = static_cast<int>(std::min(live.size(), next.size()));
  if (scratch.checksums_wrong != 0)
    return Status::Corruption(std::to_string(scratch.checksums_wrong) + " consumers reported a checksum that is not the producer's");
  return h;
}

// --------------------------------------------------------------------------- report

struct Figures {
  double link_gbps = 0;   // the link: the shaped rate, or the measured stream when unshaped
  double wire_gbps = 0;   // one TCP stream h1 -> h2, measured
  std::vector<double> rates;  // GB/s per consumer behind a link
  double Min() const { return rates.empty() ? 0 : *std::min_element(rates.begin(), rates.end()); }
};

void Print(const FanoutRun& run, const Row& single, const Row& placed, const Wire& w, const Figures& f, const json& tree,
           const Heal& h) {
  const auto& cfg = run.config;
  std::printf("\n== fan-out placed by the registry: snapshot %s (NT3-like), %d consumers on %d hosts (%d each), producer in h1,"
              " at most %d child(ren) per relay, links %s\n",
              HumanBytes(static_cast<double>(run.bytes)).c_str(), cfg.consumers, cfg.hosts, run.per_host, cfg.max_children,
              cfg.link_rate.empty() ? "unshaped (veth)" : ("shaped to " + cfg.link_rate).c_str());
  std::printf("   tree the registry made (relay <- the node it relays from): %s\n", TreeText(tree).c_str());
  std::printf("   wire h1 -> h2, one TCP stream: %s ms, %.3f GB/s%s%s\n", Ms(w.SingleS(run.bytes, false)).c_str(), f.wire_gbps,
              w.error.empty() ? "" : "  ERROR: ", w.error.c_str());
  std::printf("   producer egress per update: %.2f model sizes (one consumer alone, measured: %.2f; ratio %.2f)\n", placed.egress,
              single.egress, placed.egress / std::max(single.egress, 1e-9));
  std::vector<double> sorted = f.rates;
  double med = Median(sorted);
  std::printf("   receive rate, publish -> live, of the %zu consumers behind a link: min %.3f, median %.3f GB/s =\n"
              "     min %.2f, median %.2f of the link (%.3f GB/s); min %.2f, median %.2f of the measured stream\n",
              f.rates.size(), f.Min(), med, f.Min() / f.link_gbps, med / f.link_gbps, f.link_gbps, f.Min() / f.wire_gbps,
              med / f.wire_gbps);
  std::printf("   last consumer live: %s ms (first %s ms); one consumer alone: %s ms; ratio %.2f\n", Ms(placed.last.median()).c_str(),
              Ms(placed.first.median()).c_str(), Ms(single.last.median()).c_str(), placed.last.median() / single.last.median());
  std::string orphans;
  for (const auto& o : h.orphans) orphans += (orphans.empty() ? "" : ",") + o;
  std::printf("   heal: %s's relay killed (kill -9) %s ms after a publish; its child(ren) %s relayed from the new parent %s ms\n"
              "     after the kill, every surviving consumer was live on that version %s ms after it (undisturbed: %s ms after the\n"
              "     publish; the kill added %s ms); heal %s ms. Producer egress for that version %.2f, for the next %.2f;\n"
              "     next version live at all %d surviving consumers in %s ms. Tree after: %s\n",
              h.victim.c_str(), Ms(h.kill_after_s).c_str(), orphans.c_str(), Ms(h.rejoin_s).c_str(), Ms(h.live_s).c_str(),
              Ms(h.undisturbed_s).c_str(), Ms(h.kill_after_s + h.live_s - h.undisturbed_s).c_str(), Ms(h.heal_s()).c_str(),
              h.egress_in_flight, h.egress_next, h.survivors, Ms(h.next_last_s).c_str(), TreeText(h.tree_after).c_str());
  std::printf("   (medians of %d timed updates after %d warm-up; egress counted by the producer's node; consumers %s)\n",
              cfg.base.reps, cfg.base.warmup,
              cfg.verify ? "hash what they map and report the checksum (--fanout-verify)" : "map without hashing (the default)");
}

json HealJson(const Heal& h) {
  return {{"victim", h.victim}, {"victim_pid", h.victim_pid}, {"orphans", h.orphans}, {"tree_before", h.tree_before}, {"tree_after", h.tree_after},
          {"kill_after_publish_s", h.kill_after_s}, {"rejoin_s", h.rejoin_s}, {"live_s", h.live_s}, {"heal_s", h.heal_s()},
          {"undisturbed_s", h.undisturbed_s}, {"egress_in_flight_sizes", h.egress_in_flight},
          {"egress_next_sizes", h.egress_next}, {"next_last_s", h.next_last_s}, {"survivors", h.survivors}};
}

}  // namespace

Status RunFanoutAuto(FanoutConfig config, const std::string& json_path) {
  FanoutRun run;
  run.config = std::move(config);
  if (run.config.hosts < 3) return Status::InvalidArgument("--fanout --auto: --fanout-hosts must be 3 or more (a relay with a child to kill)");
  VIPER_ASSIGN_OR_RETURN(std::string h1, HostAddress("h1"));
  VIPER_ASSIGN_OR_RETURN(Redis redis, StartRedis(h1, run.config.base.log_path));
  run.config.registry = redis.url;
  VIPER_RETURN_IF_ERROR(Setup(run));
  Wire w;
  MeasureWire(run, "", w);
  VIPER_ASSIGN_OR_RETURN(Row single, SingleRow(run));
  VIPER_ASSIGN_OR_RETURN(std::vector<Reporter> reporters, StartPlacedHosts(run, redis.url));
  VIPER_ASSIGN_OR_RETURN(Row placed, RunRow(run, "placed", reporters));
  json tree = Tree(run, reporters);
  VIPER_ASSIGN_OR_RETURN(Heal heal, RunHeal(run, reporters, placed, run.config.base.warmup + run.config.base.reps));
  // In the reverse of their start order (a chain placed as they started: leaves first), so that
  // no stopped relay's child re-joins on the way out.
  for (auto it = reporters.rbegin(); it != reporters.rend(); ++it) it->child->Stop();
  if (!run.config.base.quick) MeasureWire(run, "", w);
  redis.child->Stop(milliseconds(200));

  Figures f;
  f.wire_gbps = Median(w.single);
  f.link_gbps = run.config.link_rate.empty() ? f.wire_gbps : TcRateBytes(run.config.link_rate) / 1e9;
  f.rates = ReceiveRates(run, placed);
  Print(run, single, placed, w, f, tree, heal);
  if (placed.checksums_wrong != 0)
    return Status::Corruption(std::to_string(placed.checksums_wrong) + " consumers reported a checksum that is not the producer's");
  Report report;
  report.Target("fan-out placed: producer egress per update, model sizes", placed.egress, 1.5, /*at_most=*/true);
  report.Target("fan-out placed: slowest consumer's receive rate / link rate", f.Min() / f.link_gbps, 0.6, /*at_most=*/false);
  report.Target("fan-out placed: last consumer live / single consumer", placed.last.median() / single.last.median(), 1.5,
                /*at_most=*/true);
  report.Target("fan-out placed: relay killed -> children re-attached and every consumer live, s", heal.heal_s(), 2.0,
                /*at_most=*/true);
  json targets = report.PrintTargets();
  if (json_path.empty()) return Status::OK();
  json consumers = json::array();
  for (double g : f.rates) consumers.push_back({{"gbps", g}, {"of_link", g / f.link_gbps}, {"of_wire", g / f.wire_gbps}});
  json out = {{"fanout_auto",
               {{"bytes", run.bytes}, {"hosts", run.config.hosts}, {"consumers", run.config.consumers},
                {"link_rate", run.config.link_rate}, {"link_gbps", f.link_gbps}, {"max_children", run.config.max_children},
                {"verify", run.config.verify}, {"tree", tree}, {"rows", {RowJson(single), RowJson(placed)}},
                {"receive", consumers}, {"wire", w.Json(run.bytes)}, {"heal", HealJson(heal)}, {"targets", targets}}}};
  std::ofstream(json_path) << out.dump(2) << "\n";
  return Status::OK();
}

}  // namespace viper::bench
