// Relay: makes a Node a replica holder of another node's models (`viper serve --upstream`).
// For each model it subscribes to the upstream node and fetches every new version: over UCX
// (another host) straight into a segment of this node (Node::Receive), forwarding each chunk to
// downstream relays and remote consumers as it lands, then commits it under the same version number
// once verified; versions loaded otherwise (map, copy, file) are copied into a segment. Consumers
// on this host map it locally; the catalog lists the upstream's replicas after this node's own;
// the relay announces itself to the upstream (REPLICA), which lists it among the version's
// replicas while the relay stays connected. Relays naming each other as upstreams form a chain or
// tree (fan-out). Design: docs/ARCHITECTURE.md "Replicas across nodes" and "Fan-out".
//
// Thread-safety: Start and the destructor from one thread. The Relay must be destroyed before
// the Node it feeds.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "viper/node.h"
#include "viper/registry.h"
#include "viper/status.h"

namespace viper {

// Children a relay takes in a registry-placed tree by default (RelayOptions::max_children):
// docs/BENCHMARKS.md "Fan-out placed by the registry" measures the choice (a chain against a
// binary tree); docs/ARCHITECTURE.md "A chain unless told otherwise" gives the reasons.
inline constexpr uint32_t kDefaultRelayChildren = 1;

struct RelayOptions {
  std::string upstream;             // the upstream node's "host:port" (REQUIRED unless `registry`)
  // Placement (docs/ARCHITECTURE.md "Placement and healing"): with no `upstream`, the shared
  // registry ("redis://HOST:PORT[/DB]") picks this relay's parent for each model among the model's
  // holders and relays, atomically (bounded children, this host first, then the shallowest, least
  // loaded node), and another one within about one heartbeat when the parent dies.
  std::string registry;
  std::string registry_password;    // Redis AUTH password of `registry`; empty = none
  uint32_t max_children = kDefaultRelayChildren;  // children this relay takes in the tree (1-1024)
  RegistryHeartbeat heartbeat;      // the tree membership's TTL and its refresh
  // Nodes to relay from, in order, while `upstream` is unreachable (e.g. the upstream's own
  // upstream: a chain that loses a relay re-attaches past it; SubscriberOptions::alternates). The
  // relay returns to `upstream` when it answers again (SubscriberOptions::preferred_probe).
  std::vector<std::string> alternates;
  std::vector<std::string> models;  // REQUIRED: models to replicate
  std::string token;                // HELLO token for the upstream
  std::filesystem::path file_dir;   // the upstream's file tier as seen from here (fallback)
  // Fetch over UCX (received in place, forwarded while it lands) even from an upstream on this
  // host, which would otherwise be mapped and copied: for tests and measurements on one host.
  bool always_remote = false;
  // Receive versions the upstream is itself still receiving, as they land (INCOMING): per-hop
  // pipelining. false: store and forward (only complete versions), for comparison.
  bool pipelined = true;
  // The upstream is asked to answer after this much silence and given up (for an alternate, or
  // another parent from the registry) if it does not answer within liveness_timeout
  // (SubscriberOptions::liveness_probe). 0: never asked.
  std::chrono::milliseconds liveness_probe{5000};
  std::chrono::milliseconds liveness_timeout{5000};
};

struct RelayStats {
  uint64_t versions_relayed = 0;
  uint64_t versions_received_in_place = 0;  // ...that landed straight in this node's segment (no copy)
  uint64_t failures = 0;
  // Registry-placed relays (RelayOptions::registry): places taken in the relay trees, the first
  // join of each model and then one per re-attachment after a parent was lost.
  uint64_t joins = 0;
  std::map<std::string, std::string> connected_to;  // model -> the node relayed from now ("" = none)
  UpstreamStats upstream;  // as the node's STATS show it
};

class Relay {
 public:
  // Subscribes to the upstream. An upstream (and alternates) not up yet is waited for: the relay
  // retries with a bounded backoff (SubscriberOptions::wait_for_node), logs once per change, and
  // NodeStats::upstream shows it. While on an alternate it probes the upstream every second and
  // moves back to it between two versions once it answers.
  static Result<std::unique_ptr<Relay>> Start(Node& node, const RelayOptions& options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  RelayStats stats() const;

 private:
  struct Impl;
  explicit Relay(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace viper
