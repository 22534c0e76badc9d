// What the catalog knows of a version: its model, number, size, checksums, times, metadata and
// the replicas that hold it (shared-memory segments, nodes, files, relays, a GPU copy). Node,
// Subscriber and the registry hand these to users; the control protocol (src/net/protocol.h, in
// tree only) carries them on the wire under the same names (docs/PROTOCOL.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace viper::proto {

// Bounds a VersionInfo keeps (the protocol's decoder and the registry's records refuse more):
// bytes of each string (model, metadata key or value, locator, ...), metadata entries, replicas.
inline constexpr uint32_t kMaxStringBytes = 64 * 1024;
inline constexpr uint32_t kMaxMetadataEntries = 4096;
inline constexpr uint32_t kMaxReplicas = 256;

enum class ReplicaKind : uint8_t { kHostSegment = 1, kNode = 2, kFile = 3, kRelay = 4, kDevice = 5 };

// One copy of a version: a shared-memory segment on host `host_key`, a node reachable at
// `locator` = "host:port" that sends it over UCX, or a file at `locator` (a path). kRelay: a
// node at `locator` that relays the model and will hold this version once it has fetched it (a
// NOTIFY goes out before any relay holds the version; its REPLICA then lists it as kNode).
// kDevice: the producer keeps the version in GPU memory on host `host_key`, device `locator` =
// "cuda:N"; a consumer on that host opens it through CUDA IPC (FETCH in kDevice mode). Listed only
// in NOTIFY (never in LIST, the registry or a relay's catalog), and only while it is the device's
// live version.
struct Replica {
  ReplicaKind kind = ReplicaKind::kNode;
  std::string host_key;
  std::string locator;
  bool operator==(const Replica&) const = default;
};

struct VersionInfo {
  std::string model;
  uint64_t version = 0;
  uint64_t size = 0;         // bytes of the whole snapshot buffer
  uint64_t checksum = 0;     // xxh3-64 of the data region
  uint64_t step = 0;
  int64_t publish_ns = 0;    // CLOCK_REALTIME when the producer called publish
  int64_t completed_ns = 0;  // CLOCK_REALTIME when the version was complete in the host tier
  std::map<std::string, std::string> metadata;
  std::vector<Replica> replicas;
  bool operator==(const VersionInfo&) const = default;
};

}  // namespace viper::proto
