// `viper bench`: what one run measures and how (the configuration and the results every part of
// the harness shares). Not thread-safe; one run at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "viper/status.h"

namespace viper::bench {

// Seconds of repeated measurements of one quantity.
struct Samples {
  std::vector<double> s;
  void Add(double seconds) { s.push_back(seconds); }
  bool empty() const { return s.empty(); }
  double Percentile(double p) const;  // nearest rank on the sorted samples; 0 when empty
  double median() const { return Percentile(50); }
  double mean() const;  // 0 when empty
  double min() const;
  double max() const;
  nlohmann::json Json() const;  // {"median","mean","p99","min","max","n","samples"}
};

struct Config {
  std::vector<std::pair<std::string, uint64_t>> sizes;  // label, snapshot bytes
  int warmup = 4;           // untimed publishes per (mode, path): they fault in segments and buffers
  int reps = 5;             // timed publishes per (mode, path)
  int baseline_reps = 3;    // timed file + poll updates per size, at phases spread over the interval
  int notify_count = 1000;  // small versions for the notification percentiles
  double poll_interval_s = 1.0;
  int hosts = 1;            // 1: consumer on this host (map, copy); 2: in namespace h2 (remote)
  std::string listen = "127.0.0.1:0";  // producer node
  std::vector<std::string> consumer_prefix;  // prepended to consumer commands (hosts.sh exec h2 --)
  std::string file_dir;     // baseline files (a disk, not tmpfs)
  std::string peer_ip;      // --hosts 2: the consumer host's address (wire baselines)
  std::string link_rate;    // --hosts 2: each host's egress shaped to this tc rate (empty: unshaped veth)
  std::string wire_bin;     // viper_wire_baseline
  std::string log_path;     // children's stderr
  bool quick = false;
  bool diagnose = true;     // add the sync diagnostic row (see ModeResult::variant)
  std::vector<std::string> only;  // --only: run just these once-parts (section.h), no sizes
  uint64_t delta_bytes = 256ull << 20;  // delta part, case (a): the bf16 model's size
  std::string delta_models;  // delta part: bench/delta_models.py's output (empty: made under file_dir)
  int delta_threads = 2;     // delta part: the producer node's encoder threads (NodeOptions::delta_threads)
};

struct ModeResult {
  std::string mode, path;
  // "" = the consumer's default settings (what users get). Diagnostic rows: "verify-local" (the
  // consumer also verifies map/copy bytes; shows what that pass costs), "no-verify" (remote: the
  // consumer verifies nothing); across hosts, the producer's: "no-cut-through" (announced once
  // committed), "draft" / "draft-no-cut-through" (Begin, written in place, timed from Commit).
  std::string variant;
  Samples e2e;       // publish called -> live in the consumer
  Samples stall;     // producer blocked in Publish()
  Samples stall_cpu; // CPU time of the publishing thread in Publish() (the rest it waited)
  Samples copy;      // of which copying tensors into the segment
  Samples complete;  // publish called -> complete in the host tier (announced)
  Samples notify;    // complete -> NOTIFY received
  Samples fetch;     // NOTIFY -> bytes available
  Samples verify;    // bytes -> checksum verified
  // CPU-seconds the whole machine was busy (every CPU, every process, the kernel) from the publish
  // call until the consumer reported the version live: with n CPUs, e2e >= machine_busy / n.
  Samples machine_busy;
  int fresh_segments = 0;  // timed publishes that got a fresh (not recycled) segment: slower
};

// The baseline users run today, measured: the producer writes a safetensors file (tmp + fsync +
// rename + fsync(dir)) while a separate process polls the directory every interval_s on its own
// fixed grid and reads each new file back. Each timed file is renamed into view at a different
// phase of the poller's grid, the phases spread evenly over the interval ((k + 0.5) / n for n
// updates, in shuffled order; the poller reports where its grid is; the writer holds the written
// file until then, a wait left out of the figures): the wait for the next poll is then sampled
// evenly instead of by the luck of a few random phases. The baseline's figure is the mean of the
// measured e2e over those phases (figure()), the mean latency of an update.
struct PollResult {
  Samples e2e;    // write called -> file read and parsed by the poller (measured; the hold left out)
  Samples stall;  // write + fsync + rename + fsync(dir) (the hold left out)
  Samples wait;   // file renamed into view -> found by the poller's next poll
  Samples read;   // poller: found -> read and parsed
  std::vector<double> phases;  // where in the poller's grid each timed file became visible, 0..1
  double interval_s = 1.0;
  double figure() const { return e2e.mean(); }
  // From the measured parts: stall + interval/2 (the mean wait for a uniformly placed update) +
  // read. An extra figure beside the measured e2e, to check it.
  double expected_e2e() const { return stall.median() + interval_s / 2 + read.median(); }
};

// Measured twice per size, before and after Viper's rows, so that drift of the shared machine
// shows up in the samples instead of biasing the ratio.
struct WireResult {
  bool ran = false;
  std::vector<double> tcp_all, ucx_all;  // GB/s of every timed stream / perftest run
  // The same stream received into one buffer of the snapshot's size (`--land`), and also hashed
  // with xxh3 as it arrives (`--verify`): what a receiver that keeps and verifies a whole model
  // can reach at best on this machine (viper_wire_baseline's header).
  std::vector<double> landed_all, verified_all;
  double tcp_gbps = 0;       // median of viper_wire_baseline streams of the snapshot size
  double landed_gbps = 0, verified_gbps = 0;
  double tcp_best_gbps = 0;
  // The whole machine's busy CPU-seconds per GB moved by the plain stream and by the verifying one
  // (both ends; from /proc/stat, so process start-up is in it).
  double tcp_cpu_s_per_gb = 0, verified_cpu_s_per_gb = 0;
  std::string tcp_cc;
  double ucx_gbps = 0;       // ucx_perftest tag_bw, one message of the snapshot size (median of runs)
  // The same with peer-failure handling (`ucx_perftest -e`), as Viper's endpoints must have: over
  // TCP it loses the rendezvous put lane (docs/ARCHITECTURE.md, "The listener is Viper's own socket").
  std::vector<double> ucx_peer_all;
  double ucx_peer_gbps = 0;
  std::string ucx_tls;
  std::string error;         // what failed, if anything
};

struct SizeResult {
  std::string label;
  uint64_t bytes = 0;
  size_t tensors = 0;
  Samples memcpy_s;    // warm memcpy of the data region (the floor)
  Samples memcpy_cpu_s;  // its CPU time (equal to memcpy_s unless the thread waited for a CPU)
  Samples checksum_s;  // one xxh3-64 pass over the data region (each end does one)
  std::vector<ModeResult> modes;
  PollResult poll;
  WireResult wire;
  nlohmann::json sections = nlohmann::json::object();  // figures of registered sections, by name (section.h)
};

struct NotifyResult {
  int count = 0;
  uint64_t bytes = 0;
  Samples notify;  // complete -> NOTIFY received, per version
  Samples e2e;     // publish called -> live, per version
};

}  // namespace viper::bench
