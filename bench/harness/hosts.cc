// `viper bench --hosts 2` staging (see bench.h): re-running the command inside two network
// namespaces made by scripts/hosts.sh, and the inner stage's configuration.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "harness/bench.h"
#include "harness/child.h"

namespace viper::bench {

Result<std::string> HostAddress(const std::string& host) {
  const char* env = std::getenv("VIPER_HOSTS");
  if (!env) return Status::FailedPrecondition("VIPER_HOSTS is not set (run through scripts/hosts.sh run)");
  std::stringstream ss(env);
  for (std::string item; ss >> item;)
    if (item.starts_with(host + "=")) return item.substr(host.size() + 1);
  return Status::NotFound(host + " is not in VIPER_HOSTS=" + env);
}

Result<std::string> FindHostsScript(const std::string& explicit_path) {
  std::vector<std::string> candidates;
  if (!explicit_path.empty()) candidates.push_back(explicit_path);
  if (const char* env = std::getenv("VIPER_HOSTS_SCRIPT")) candidates.push_back(env);
  auto exe_dir = std::filesystem::path(SelfExe()).parent_path();
  candidates.push_back((exe_dir / "../../scripts/hosts.sh").string());
  candidates.push_back("scripts/hosts.sh");
  for (const auto& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return std::filesystem::canonical(c).string();
  return Status::NotFound("scripts/hosts.sh not found (give --hosts-script)");
}

Status ExecInHosts(const std::string& hosts_script, const std::vector<std::string>& inner_argv, int hosts) {
  if (::geteuid() != 0) return Status::PermissionDenied("--hosts/--fanout create network namespaces: run as root");
  VIPER_ASSIGN_OR_RETURN(std::string script, FindHostsScript(hosts_script));
  std::vector<std::string> argv = {script, "run", std::to_string(hosts), "--", script, "exec", "h1", "--"};
  argv.insert(argv.end(), inner_argv.begin(), inner_argv.end());
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  ::execv(raw[0], raw.data());
  return Status::FromErrno("exec " + script);
}

Status ShapeLinks(const std::string& script, int hosts, const std::string& rate, const std::string& log_path) {
  for (int k = 1; k <= hosts && !rate.empty(); ++k) {
    std::vector<std::string> tc;
    if (k > 1) tc = {script, "exec", "h" + std::to_string(k), "--"};
    tc.insert(tc.end(), {"tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "8mb", "latency",
                         "100ms"});
    VIPER_RETURN_IF_ERROR(
        RunCapture(tc, std::chrono::milliseconds(10000), log_path).status().WithContext("shaping h" + std::to_string(k)));
  }
  return Status::OK();
}

Status ConfigureHosts(const std::string& hosts_script, Config& c) {
  VIPER_ASSIGN_OR_RETURN(std::string script, FindHostsScript(hosts_script));
  VIPER_ASSIGN_OR_RETURN(std::string h1, HostAddress("h1"));
  VIPER_ASSIGN_OR_RETURN(c.peer_ip, HostAddress("h2"));
  c.listen = h1 + ":0";
  c.consumer_prefix = {script, "exec", "h2", "--"};
  return ShapeLinks(script, 2, c.link_rate, c.log_path);
}

}  // namespace viper::bench
