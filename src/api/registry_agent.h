// RegistryAgent: keeps one node's holdings registered in a shared registry (NodeOptions::registry).
//
// Its own thread does all registry I/O, so the node never waits on the registry: Announce and
// CatalogChanged only wake it. Each pass reads the node's catalog, puts the records that changed,
// removes those the node no longer holds, and publishes pending announcements. Each pass (and
// so every heartbeat) starts by refreshing the node's TTL (Registry::Refresh: one command,
// whatever the number of records) and puts every record again only when the registry had lost
// them (a restarted Redis, or a TTL that passed). When the registry cannot be reached it logs one warning, keeps the announcements
// for later and retries; when it is back it logs once, re-registers everything and re-announces
// the newest version of each model, so nothing announced in between is lost.
//
// Thread-safety: all methods are thread-safe. The catalog function is called on the agent's
// thread and must not call back into the agent.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "net/protocol.h"
#include "viper/registry.h"

namespace viper::internal {

struct RegistryAgentStats {
  uint64_t passes = 0;           // sync passes that reached the registry
  uint64_t failures = 0;         // passes that did not
  uint64_t announced = 0;
  uint64_t reregistrations = 0;  // recoveries after the registry was unreachable
  bool reachable = false;
};

class RegistryAgent {
 public:
  using Catalog = std::function<std::vector<proto::VersionInfo>()>;
  // Starts the thread; the first pass registers what the catalog holds (a registry that cannot be
  // reached yet is the warning above, not an error).
  static std::unique_ptr<RegistryAgent> Start(std::unique_ptr<Registry> registry, NodeRecord self,
                                              RegistryHeartbeat heartbeat, Catalog catalog);
  // Stops the thread, then removes this node's records (best effort: a registry that is down lets
  // them expire). Idempotent; Announce and CatalogChanged after it do nothing, so the node's other
  // threads may still call them while the node shuts down.
  void Stop();
  ~RegistryAgent();  // Stop()
  RegistryAgent(const RegistryAgent&) = delete;
  RegistryAgent& operator=(const RegistryAgent&) = delete;

  // A version just committed: register and announce it.
  void Announce(const proto::VersionInfo& info);
  // Replicas or versions changed (file flushed, retention): register the change.
  void CatalogChanged();
  RegistryAgentStats stats() const;
  const NodeRecord& self() const { return self_; }

 private:
  RegistryAgent(std::unique_ptr<Registry> registry, NodeRecord self, RegistryHeartbeat heartbeat, Catalog catalog);
  void Run();
  // One pass; `full` puts every record again, `announce_all` announces the newest of each model.
  Status Sync(bool full, bool announce_all);
  void Withdraw();
  bool stopped_ = false;  // Stop() ran (its caller's thread only: the node's destructor)

  using Key = std::pair<std::string, uint64_t>;
  std::unique_ptr<Registry> registry_;
  const NodeRecord self_;
  const RegistryHeartbeat heartbeat_;
  Catalog catalog_;

  mutable std::mutex mu_;  // guards below
  std::condition_variable cv_;
  bool stop_ = false;
  bool changed_ = false;
  std::set<std::string> to_announce_;  // models whose newest version is not announced yet
  RegistryAgentStats stats_;

  // Agent thread only.
  std::map<Key, proto::VersionInfo> registered_;  // what the registry holds from us, as we put it
  std::set<Key> refused_;                         // versions whose record did not validate (logged)
  std::thread thread_;
};

}  // namespace viper::internal
