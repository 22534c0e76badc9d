// RelayPlacement: one model's place in the registry's relay tree, for a relay that names no
// upstream (RelayOptions::registry; docs/ARCHITECTURE.md "Placement and healing").
//
// Choose() is the relay subscriber's SubscriberOptions::choose_node: called whenever it needs a
// node (first connect, after a lost connection, after a failed connect), it asks the registry for
// a parent (Registry::Join) among the tree's members and the model's roots (holders outside the
// tree: the producer's node). After a connection to the parent was lost (the parent died, or the
// subscriber dropped it after a broken transfer) the parent is tried again; a parent the
// subscriber could not reach is avoided for one TTL, so that its lingering records are not chosen
// again, and presumed dead (JoinRequest::avoid). Its own
// thread keeps the membership alive (Registry::Stay every heartbeat interval) and joins again,
// under the same parent, when the registry lost it. The destructor leaves the tree.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "viper/registry.h"

namespace viper::internal {

struct RelayPlacementOptions {
  std::string model;
  NodeRecord self;                  // the relay's node as it registers itself
  uint32_t max_children = 1;
  RegistryHeartbeat heartbeat;
};

class RelayPlacement {
 public:
  static Result<std::unique_ptr<RelayPlacement>> Start(std::unique_ptr<Registry> registry, RelayPlacementOptions options);
  ~RelayPlacement();
  RelayPlacement(const RelayPlacement&) = delete;
  RelayPlacement& operator=(const RelayPlacement&) = delete;

  // The parent's address, or why there is none now (NotFound: no holder or no free slot yet).
  // `unreachable`: the node the subscriber's last connect did not reach (SubscriberOptions::choose_node).
  Result<std::string> Choose(const std::string& unreachable);
  uint64_t joins() const;  // successful joins (the first, then one per re-attachment)

 private:
  RelayPlacement(std::unique_ptr<Registry> registry, RelayPlacementOptions options);
  Result<Placement> JoinLocked(std::unique_lock<std::mutex>& lock);
  void Run();

  std::unique_ptr<Registry> registry_;
  const RelayPlacementOptions options_;
  mutable std::mutex mu_;  // guards below; registry calls are made holding it (one at a time)
  std::condition_variable cv_;
  bool stop_ = false;
  std::string parent_;  // the address chosen last ("" = none yet, or lost)
  std::string lost_;    // the parent that did not answer, until another is found
  std::map<std::string, std::chrono::steady_clock::time_point> avoid_;  // address -> until
  uint64_t joins_ = 0;
  std::thread thread_;
};

}  // namespace viper::internal
