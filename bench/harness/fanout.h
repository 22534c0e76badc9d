// `viper bench --fanout`: one model version to many consumers on several hosts (network namespaces
// from scripts/hosts.sh; the command re-runs itself as root inside them, the producer in h1).
//
// Rows, each measured over the same producer (an embedded Publisher in h1, sync publish):
//   single       one consumer on h2 fetching from the producer's node (remote): the reference time
//   direct       N consumers, N/H per host, all from the producer's node (h1's map, the others remote)
//   chain,saf    a chain of relays h1 -> h2 -> ... -> hH, store and forward (a relay fetches a
//                version once its upstream has all of it), N/H consumers per host mapping their node
//   chain        the same chain pipelined: each relay forwards chunks as they land
// Per update: the producer node's egress (NodeStats::bytes_sent, counted in the node) in model
// sizes, and the times from publish to the first and the last consumer live. Beside them, measured
// in the same run across the same veths: one raw TCP stream h1 -> h2, and H-1 streams at once
// along the chain (h1 -> h2, h2 -> h3, ...), plain and landed + hashed (--verify): on one VM every
// host shares the same CPUs, and the concurrent streams show what the hardware allows a chain.
// With link_rate every host's link is shaped (real hosts: the link, not the CPU, is the limit).
// Every node sends full copies (DeltaMode::kOff): each update publishes the same tensors, whose
// delta would be a few KiB; a full copy is the case fan-out is for (every weight changed), and
// deltas are measured on their own (docs/BENCHMARKS.md).
//
// Each host but h1 runs one `viper bench-peer fanout-host` (a node, a relay for the chain rows,
// and its consumers as child processes, so that they share the host's mount namespace and map the
// node's segments); it prints one line per version once all its consumers have it live.
#pragma once

#include <string>

#include "harness/types.h"
#include "viper/status.h"

namespace viper::bench {

struct FanoutConfig {
  Config base;               // sizes (the first is used), warmup, reps, wire_bin, log_path
  int hosts = 4;             // h1 (producer) .. hH
  int consumers = 8;         // spread evenly over the hosts (a multiple of `hosts`)
  std::string hosts_script;  // scripts/hosts.sh
  // Each host's egress shaped to this rate (tc tbf, e.g. "2gbit"): links slower than the CPUs, as
  // between real hosts, instead of veths that only the shared CPUs limit. Empty: unshaped.
  std::string link_rate;
  // Every consumer also hashes what it maps and checks it against the announced checksum
  // (SubscriberOptions::verify_local), and reports that checksum: bit-exact, at one xxh3 pass each.
  bool verify = false;
  std::string registry;   // the producer's node registers here ("": no registry; RunFanoutAuto sets it)
  int max_children = 1;   // RunFanoutAuto: RelayOptions::max_children of every relay
};

// Inside h1 (after ExecInHosts): measures every row and the wire, prints them and the targets,
// writes JSON to `json_path` unless empty.
Status RunFanout(FanoutConfig config, const std::string& json_path);

// `viper bench --fanout --auto` (fanout_auto.cc): the same hosts, but no upstream is written down:
// a redis-server in h1 is the registry, the producer's node registers in it, and every other host's
// relay (`RelayOptions::registry`, no upstream) is placed by it. Measured against the single
// consumer and the wire of the same run: the producer's egress per update, each consumer's receive
// rate against its link, the last consumer live against one consumer alone, and the heal after a
// relay with a child is killed (kill -9) while a version is on its way: its children re-attached
// through the registry and every surviving consumer live again.
Status RunFanoutAuto(FanoutConfig config, const std::string& json_path);

struct FanoutHostOptions {
  std::string listen;    // this host's address, port 0
  std::string upstream;  // relay from this node ("": no relay: consumers go to `connect`)
  std::string connect;   // without a relay: the node the consumers subscribe to
  std::string model = "fan";
  std::string path = "map";  // the consumers' fetch path
  int consumers = 2;
  bool pipelined = true;
  // Instead of `upstream`: the relay is placed by this registry (redis://), and the node registers
  // in it. The peer then prints {"event":"upstream","upstream":ADDR,"joins":N,"t_ns":T} each time its
  // relay moves to another node ("" while it has none).
  std::string registry;
  int max_children = 1;
  bool verify_local = false;  // consumers: SubscriberOptions::verify_local
};

// `viper bench-peer fanout-host`: prints {"ready":true,"address":...,"pid":...} once its consumers
// are ready, then one line per version once every consumer has it live: {"version", "live_ns": [..],
// "paths": [..], "checksums": [..]} (consumer by consumer, in the order they were started); exits
// when stdin closes.
Status RunFanoutHost(const FanoutHostOptions& options);

}  // namespace viper::bench
