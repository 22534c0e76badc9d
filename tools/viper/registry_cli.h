// The --registry option of the node commands (serve, watch, pull, ls).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "viper/registry.h"

namespace viper::cli {

inline void AddRegistry(CLI::App& app, std::string& url, std::string& password_file) {
  app.add_option("--registry", url, "Shared registry: redis://HOST:PORT[/DB] (instead of --connect)")
      ->check(RegistryUrl());
  app.add_option("--registry-password-file", password_file,
                 "File holding the registry's Redis AUTH password (owner-only, like a token file)")
      ->check(ReadableFile());
}
// The password of --registry-password-file ("" when not given), with a secret file's hygiene.
Result<std::string> RegistryPassword(const std::string& password_file);
// TTL of a node's records and a heartbeat every third of it. InvalidArgument outside 0.3-86400 s.
Result<RegistryHeartbeat> HeartbeatForTtl(double ttl_seconds);
// Every node that holds `version` (0 = any, the newest first) of `model` according to the
// registry, in the order to try them (registry.h HoldersInOrder); NotFound if none. With a fleet
// token, holders whose version's seal does not verify (seal.h) are skipped with a warning naming
// each, so the newest sealed version's holders come first.
Result<std::vector<std::string>> NodesHolding(const std::string& url, const std::string& password,
                                              const std::string& model, uint64_t version,
                                              const std::string& token = "");
// `viper ls --registry`: every model, version and holder the registry lists (with a token, those
// whose seal verifies, as NodesHolding).
int RunLsRegistry(const std::string& url, const std::string& password, const std::string& token, bool json);

}  // namespace viper::cli
