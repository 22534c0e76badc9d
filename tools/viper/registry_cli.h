// The --registry option of the node commands (serve, watch, pull, ls).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "viper/registry.h"

namespace viper::cli {

inline void AddRegistry(CLI::App& app, std::string& url) {
  app.add_option("--registry", url, "Shared registry: redis://HOST:PORT[/DB] (instead of --connect)")
      ->check(RegistryUrl());
}
// TTL of a node's records and a heartbeat every third of it. InvalidArgument outside 0.3-86400 s.
Result<RegistryHeartbeat> HeartbeatForTtl(double ttl_seconds);
// The address of the nearest node (this host first) that holds `version` of `model` (0 = the
// newest) according to the registry.
// With a fleet token, holders whose version's seal does not verify (seal.h) are skipped with a
// warning naming each, and the nearest holder of the newest sealed version is chosen.
Result<std::string> NearestNodeHolding(const std::string& url, const std::string& model, uint64_t version,
                                       const std::string& token = "");
// `viper ls --registry`: every model, version and holder the registry lists.
int RunLsRegistry(const std::string& url, bool json);

}  // namespace viper::cli
