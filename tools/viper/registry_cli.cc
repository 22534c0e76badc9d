#include "registry_cli.h"

#include <cinttypes>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "command.h"
#include "node_common.h"
#include "seal.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper::cli {

Result<RegistryHeartbeat> HeartbeatForTtl(double ttl_seconds) {
  if (!(ttl_seconds >= 0.3 && ttl_seconds <= 86400))
    return Status::InvalidArgument("--registry-ttl must be 0.3-86400 seconds");
  RegistryHeartbeat hb;
  hb.ttl = std::chrono::milliseconds(static_cast<int64_t>(ttl_seconds * 1000));
  hb.interval = hb.ttl / 3;
  return hb;
}

Result<std::string> RegistryPassword(const std::string& password_file) {
  if (password_file.empty()) return std::string();
  return ReadRegistryPasswordFile(password_file);
}

Result<std::vector<std::string>> NodesHolding(const std::string& url, const std::string& password,
                                              const std::string& model, uint64_t version, const std::string& token) {
  VIPER_ASSIGN_OR_RETURN(auto registry, OpenRegistry(url, RegistryOptions{.password = password}));
  VIPER_ASSIGN_OR_RETURN(RegistryLookup found, registry->Lookup(model));
  for (const auto& r : found.rejected) std::fprintf(stderr, "viper: registry record ignored: %s\n", r.c_str());
  if (version != 0) std::erase_if(found.holders, [&](const HolderRecord& h) { return h.info.version != version; });
  std::erase_if(found.holders, [&](const HolderRecord& h) {
    Status sealed = internal::CheckSeal(token, h.info, "node " + h.node.address);
    if (!sealed.ok()) std::fprintf(stderr, "viper: holder skipped: %s\n", sealed.message().c_str());
    return !sealed.ok();
  });
  std::vector<std::string> out;
  for (const auto& h : HoldersInOrder(found, LocalHostKey())) out.push_back(h.node.address);
  if (out.empty())
    return Status::NotFound("registry " + url + " lists no node holding " + model +
                            (version ? " version " + std::to_string(version) : ""));
  return out;
}

int RunLsRegistry(const std::string& url, const std::string& password, const std::string& token, bool json) {
  auto registry = OpenRegistry(url, RegistryOptions{.password = password});
  if (!registry.ok()) return Fail("ls", registry.status());
  auto models = (*registry)->Models();
  if (!models.ok()) return Fail("ls", models.status());
  nlohmann::json out = nlohmann::json::array();
  if (!json) std::printf("%-20s %8s %12s %10s  %-22s %s\n", "MODEL", "VERSION", "SIZE", "STEP", "NODE", "REPLICAS");
  size_t rows = 0;
  for (const auto& model : *models) {
    auto found = (*registry)->Lookup(model);
    if (!found.ok()) return Fail("ls", found.status());
    for (const auto& r : found->rejected) std::fprintf(stderr, "viper ls: registry record ignored: %s\n", r.c_str());
    // With the fleet's token, only what a node of the fleet sealed is listed (as pull takes).
    std::erase_if(found->holders, [&](const HolderRecord& h) {
      Status sealed = internal::CheckSeal(token, h.info, "node " + h.node.address);
      if (!sealed.ok()) std::fprintf(stderr, "viper ls: holder skipped: %s\n", sealed.message().c_str());
      return !sealed.ok();
    });
    for (const auto& h : found->holders) {
      ++rows;
      std::string replicas;
      nlohmann::json replica_list = nlohmann::json::array();
      for (const auto& r : h.info.replicas) {
        replicas += (replicas.empty() ? "" : " ") + ReplicaText(r);
        replica_list.push_back(ReplicaText(r));
      }
      if (json) {
        out.push_back({{"model", h.info.model}, {"version", h.info.version}, {"bytes", h.info.size},
                       {"step", h.info.step}, {"checksum", checksum_hex(h.info.checksum)},
                       {"node", h.node.address}, {"node_name", h.node.name}, {"replicas", replica_list}});
        continue;
      }
      std::printf("%-20s %8" PRIu64 " %12s %10" PRIu64 "  %-22s %s\n", h.info.model.c_str(), h.info.version,
                  HumanBytes(static_cast<double>(h.info.size)).c_str(), h.info.step, h.node.address.c_str(),
                  replicas.c_str());
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  else if (rows == 0) std::printf("(no models)\n");
  return 0;
}

}  // namespace viper::cli
