// The measurements of `viper bench`, each a function of the run's Config (bench.cc calls them in
// order and prints what they return). Every consumer is a separate process (`viper bench-peer`),
// so the figures include what a real inference server pays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/section.h"
#include "harness/types.h"
#include "harness/update.h"

namespace viper::bench {

// The floor (warm memcpy, one checksum pass), Viper's rows for every (publish mode, fetch path),
// the file + polling baseline and the registered per-size sections (section.h), for an NT3-shaped
// snapshot of about `bytes`.
Result<SizeResult> RunSize(const Config& config, const std::string& label, uint64_t bytes, Report& report);

// The file + polling baseline for `m` (see PollResult).
Result<PollResult> RunPoll(const Config& config, const SourceModel& m, const std::string& label);

// Notification latency over config.notify_count small versions.
Result<NotifyResult> RunNotify(const Config& config);

// One ucx_perftest tag_bw run from this host to the consumer's (127.0.0.1 with --hosts 1), over
// UCX's TCP transport as Viper's engine uses it across processes: `bytes` per message, `iters`
// messages after one warm-up. Returns GB/s (ucx_perftest's overall bandwidth).
struct UcxRun {
  uint64_t bytes = 0;
  int iters = 10;
  bool peer_failure = false;    // -e on both sides: endpoints with peer-failure handling, as Viper's
  bool viper_segments = false;  // UCX_TCP_{TX,RX}_SEG_SIZE=256K and UCX_ZCOPY_THRESH=inf, the engine's defaults (net/engine.cc)
};
Result<double> UcxTagBw(const Config& config, const UcxRun& run);

// The median GB/s of max(reps, 3) plain TCP streams of `bytes` (viper_wire_baseline, one process
// to another) from this host to the consumer's; `sink` is its server's flag: "" (the wire),
// "--land" (into a buffer of the stream's size) or "--verify" (landed and hashed).
Result<double> TcpStreamGbps(const Config& config, uint64_t bytes, const std::string& sink);

// --hosts 2: one more measurement of the raw wire for `bytes` into `wire` (failures are recorded
// in wire.error, not returned); medians are recomputed over every measurement so far.
void RunWire(const Config& config, uint64_t bytes, WireResult& wire);

// Where one viper_wire_baseline stream runs: the server behind `server_prefix` (e.g. hosts.sh exec
// h2 --) listening on `server_ip`, the client behind `client_prefix` (empty: this process's host).
struct TcpEnds {
  std::string wire_bin, log_path;
  std::vector<std::string> server_prefix;
  std::string server_ip;
  std::vector<std::string> client_prefix;
};
// `reps` timed streams of `bytes` (after one untimed) into the GB/s list; `sink` is the server's
// flag: "" (the plain wire), "--land" or "--verify". `cc`: the congestion control used, if wanted.
Status MeasureTcpStream(const TcpEnds& ends, uint64_t bytes, int reps, const std::string& sink,
                        std::vector<double>& gbps_all, std::string* cc = nullptr);
double Median(std::vector<double> v);  // 0 when empty

}  // namespace viper::bench
