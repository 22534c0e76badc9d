// The node's side of a shared registry (NodeOptions::registry): a RegistryAgent fed from the
// node's catalog. The hooks in node.cc: StartRegistry after recovery, Announce after each commit,
// CatalogChanged after each file flush; the agent's heartbeat picks up every other change.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "node_impl.h"
#include "viper/log.h"

namespace viper {

Status Node::Impl::StartRegistry() {
  if (options.registry.empty()) return Status::OK();
  const RegistryHeartbeat& hb = options.registry_heartbeat;
  if (hb.ttl.count() <= 0 || hb.interval.count() <= 0 || hb.interval >= hb.ttl)
    return Status::InvalidArgument("registry heartbeat interval must be positive and shorter than the TTL (" +
                                   std::to_string(hb.interval.count()) + " ms, TTL " + std::to_string(hb.ttl.count()) +
                                   " ms)");
  VIPER_ASSIGN_OR_RETURN(auto registry, OpenRegistry(options.registry, RegistryOptions{.password = options.registry_password}));
  NodeRecord self = NodeRecordFor(options.name, address, host_key, static_cast<uint32_t>(::getpid()));
  registry_agent = internal::RegistryAgent::Start(std::move(registry), std::move(self), hb,
                                                  [this] { return CatalogSnapshot(); });
  return Status::OK();
}

// The catalog as other hosts should read it: this node's file paths absolute (the file tier may
// have been opened relative to our working directory), and replicas no reader would accept left
// out (logged once each).
std::vector<proto::VersionInfo> Node::Impl::CatalogSnapshot() const {
  std::vector<proto::VersionInfo> out;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [model, state] : models)
      for (const auto& [version, info] : state.versions) out.push_back(info);
  }
  static std::mutex warned_mu;
  static std::set<std::string> warned;
  const proto::Replica self{proto::ReplicaKind::kNode, host_key, address};
  for (auto& info : out) {
    // A version recovered from the file tier lists only its file, yet this node sends it (FETCH
    // falls back to the file): readers find a holder through its node replica.
    if (std::find(info.replicas.begin(), info.replicas.end(), self) == info.replicas.end())
      info.replicas.insert(info.replicas.begin(), self);
    for (auto& r : info.replicas) {
      std::error_code ec;
      if (r.kind == proto::ReplicaKind::kFile && r.host_key == host_key && !r.locator.empty() && r.locator[0] != '/')
        if (auto abs = std::filesystem::absolute(r.locator, ec); !ec) r.locator = abs.lexically_normal().string();
    }
    std::erase_if(info.replicas, [&](const proto::Replica& r) {
      Status st = ValidateReplica(r);
      if (st.ok()) return false;
      std::lock_guard<std::mutex> lock(warned_mu);
      if (warned.insert(r.locator).second)
        log(LogLevel::kWarn, "registry", "{} version {}: replica not registered: {}", info.model, info.version,
            st.message());
      return true;
    });
  }
  return out;
}

}  // namespace viper
