// Internals of `viper bench --fanout` (fanout.h) shared by its rows (fanout.cc) and the run placed
// by the registry (fanout_auto.cc): the run's fixed parts, the processes that report when their
// consumers went live, one row's measurement and the wire beside it. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/child.h"
#include "harness/fanout.h"
#include "harness/measure.h"
#include "harness/types.h"
#include "harness/update.h"
#include "viper/publisher.h"

namespace viper::bench {

struct Row {
  std::string name;
  int consumers = 0;
  Samples first, last;  // publish -> the first / the last consumer live
  double egress = 0;    // producer node's bytes sent per timed update, in snapshot sizes
  double cpu_s = 0;     // CPU seconds (user + system) per timed update of every process of the row
  std::vector<double> relay_egress;  // the same for each relay of the row, in chain order
  std::set<std::string> paths;       // how the consumers loaded
  // Per timed update: when it was published and when each consumer had it live (CLOCK_REALTIME
  // ns), the consumers in the same order every update: reporter by reporter, a host's by index.
  std::vector<int64_t> published_ns;
  std::vector<std::vector<int64_t>> live_ns;
  std::vector<int> consumer_host;  // host of each consumer, in that order
  // Consumers that reported the version's checksum, per update (every version, warm-up
  // included), and how many of those differed from the producer's.
  int checksums_checked = 0, checksums_wrong = 0;
};

// A process that reports when its consumers went live: `bench-peer subscribe` (one consumer:
// "live_ns" a number, "path") or `bench-peer fanout-host` ("live_ns" and "paths" arrays).
struct Reporter {
  std::unique_ptr<LineChild> child;
  std::string address;  // fanout-host: its node
  int host = 0;
  pid_t pid = 0;        // fanout-host: the node's process
  // fanout-host with a registry-placed relay: the node it relays from now ("" = none), and when
  // it last moved to a node (CLOCK_REALTIME ns) after `joins` joins of the tree.
  std::string upstream;
  int64_t upstream_ns = 0;
  uint64_t joins = 0;
};

// The run's fixed parts: hosts, producer, model, where children log.
struct FanoutRun {
  FanoutConfig config;
  std::string script;
  std::vector<std::string> ip;  // ip[k] = address of hk (ip[0] unused)
  std::unique_ptr<Publisher> pub;
  SourceModel model;
  uint64_t bytes = 0;  // snapshot size
  int per_host = 0;

  std::vector<std::string> In(int host) const;  // prefix that runs a command in host k (none for h1)
};

// Hosts, shaping, model and the producer (its node registers in config.registry if not empty).
Status Setup(FanoutRun& run);

Result<Reporter> StartReporter(const FanoutRun& run, int host, std::vector<std::string> args);
// One consumer on `host` subscribing to `connect` with fetch path `path`.
Result<Reporter> SubscribePeer(const FanoutRun& run, int host, const std::string& connect, const std::string& path);

// The live_ns of every consumer behind `r` for version v (and the paths they loaded by); records
// the relay's moves (events) in `r`; counts the checksums against `checksum` in `row`.
Status CollectLive(Reporter& r, uint64_t v, uint64_t checksum, std::vector<int64_t>& live, Row& row,
                   std::chrono::milliseconds timeout);

// Warm-up then timed publishes; every reporter's consumers must have each version before the
// next. The reporters keep running.
Result<Row> RunRow(FanoutRun& run, std::string name, std::vector<Reporter>& reporters);
// One consumer on h2 fetching from the producer's node (remote): the reference time.
Result<Row> SingleRow(FanoutRun& run);

// Bytes a node sent so far (STATS), -1 if it cannot be asked.
double BytesSent(const std::string& address);
// The producer node's bytes sent once the counter stopped moving.
uint64_t SettledBytesSent(Publisher& pub);
// The producer's checksum of its newest version (0 if none).
uint64_t LatestChecksum(FanoutRun& run);

struct Wire {
  std::vector<double> single, chain;                // GB/s: h1 -> h2 alone; each hop's median, all at once
  std::vector<double> single_verify, chain_verify;  // the same into a model-sized buffer, hashed
  std::string error;
  double SingleS(uint64_t bytes, bool verify) const { return Seconds(bytes, Median(verify ? single_verify : single)); }
  // The slowest hop of the streams run at once (all must arrive for a chain).
  double ChainS(uint64_t bytes, bool verify) const;
  static double Seconds(uint64_t bytes, double gbps) { return gbps > 0 ? static_cast<double>(bytes) / gbps / 1e9 : 0; }
  nlohmann::json Json(uint64_t bytes) const;
};
// One TCP stream h1 -> h2 alone, then one per hop h1 -> h2 -> ... -> hH at once; `sink` as in
// MeasureTcpStream. Failures go to `w.error`.
void MeasureWire(const FanoutRun& run, const std::string& sink, Wire& w);

std::string Ms(double s);  // "1234" (milliseconds, rounded)
nlohmann::json RowJson(const Row& r);

}  // namespace viper::bench
