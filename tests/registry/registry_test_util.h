// Records for registry tests.
#pragma once

#include <string>

#include "viper/registry.h"

namespace viper::testing {

// Node `n` (127.0.0.1:7000+n) on host `host_key` holding `model` version `version`.
inline HolderRecord MakeRecord(const std::string& model, uint64_t version, int n, const std::string& host_key = "host-a") {
  std::string address = "127.0.0.1:" + std::to_string(7000 + n);
  HolderRecord r;
  r.node = NodeRecordFor("node-" + std::to_string(n), address, host_key, 1000 + n);
  r.info.model = model;
  r.info.version = version;
  r.info.size = 4096 + version;
  r.info.checksum = 0x0123456789abcdefull ^ version;
  r.info.step = version * 10;
  r.info.publish_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(version);
  r.info.completed_ns = r.info.publish_ns + 1000;
  r.info.metadata = {{"viper.model", model}, {"user", "é ok"}};
  r.info.replicas = {{proto::ReplicaKind::kHostSegment, host_key, "viper.123." + std::to_string(version)},
                     {proto::ReplicaKind::kNode, host_key, address},
                     {proto::ReplicaKind::kFile, host_key, "/var/viper/" + model + "/" + std::to_string(version) + ".safetensors"}};
  return r;
}

}  // namespace viper::testing
