// `viper bench`: Viper's update path against the floor (warm memcpy) and the baseline users run
// today (safetensors file + fsync, consumer polling the directory), for NT3-shaped snapshots; plus
// the notification latency over many small versions and the parts registered in section.h.
// The CLI command (tools/viper/node_cmd_bench.cc) turns flags into a Config and calls Run.
//
// --hosts 2 re-runs the command as root inside two network namespaces (scripts/hosts.sh run 2 --
// hosts.sh exec h1 -- viper bench ... --hosts-stage 2): the producer in h1, every consumer in h2,
// and adds the raw wire measured across the same veth (TCP stream, ucx_perftest tag_bw).
// Not thread-safe; one run per process.
#pragma once

#include <string>
#include <vector>

#include "harness/types.h"
#include "viper/status.h"

namespace viper::bench {

// Measures every size of `config` (printing each one's table as it completes), then the
// notification latency and the registered once-parts, and prints the targets; writes every figure
// to `json_path` unless it is empty. Creates config.file_dir and removes it afterwards.
Status Run(const Config& config, const std::string& json_path);

// `viper bench --subscribers N`: notification latency and memory held with N subscriber processes
// on one node, against UCX's one-way latency and one subscriber measured in the same run (load.cc).
// Prints its figures; writes them to `json_path` if not empty.
Status RunLoad(const Config& config, int subscribers, const std::string& json_path);

// scripts/hosts.sh: `explicit_path` if not empty, else $VIPER_HOSTS_SCRIPT, else the one beside
// the build tree (build/bin/../../scripts), else ./scripts/hosts.sh; the first executable one.
Result<std::string> FindHostsScript(const std::string& explicit_path);

// Replaces this process by `hosts.sh run HOSTS -- hosts.sh exec h1 -- inner_argv...` (hosts.sh found
// by FindHostsScript(hosts_script)); returns only on failure. REQUIRES: root (network namespaces).
Status ExecInHosts(const std::string& hosts_script, const std::vector<std::string>& inner_argv, int hosts = 2);

// Inside the hosts: the address of `host` ("h2") from $VIPER_HOSTS ("h1=10.77.0.1 h2=...").
Result<std::string> HostAddress(const std::string& host);

// Shapes the egress of hosts h1 .. h`hosts` (their eth0) to `rate` with tc tbf ("2gbit"; nothing if
// empty): links slower than the shared CPUs, as between real hosts. Inside h1, as root.
Status ShapeLinks(const std::string& hosts_script_path, int hosts, const std::string& rate, const std::string& log_path);

// Inside h1 (the inner stage): the producer listens on h1's address from $VIPER_HOSTS, consumers
// and wire servers run in h2 through `hosts.sh exec h2 --`; both links shaped to config.link_rate.
Status ConfigureHosts(const std::string& hosts_script, Config& config);

}  // namespace viper::bench
