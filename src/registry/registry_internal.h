// Private parts of the registry backends (src/registry). Include only from src/registry and tests.
#pragma once

#include <memory>
#include <string>

#include "viper/registry.h"

namespace viper::registry_internal {

// "redis://HOST[:PORT][/DB]", parsed.
struct RedisEndpoint {
  std::string host;
  uint16_t port = 6379;
  int db = 0;
};
// InvalidArgument naming the fault (the URL is quoted, cut and escaped).
Result<RedisEndpoint> ParseRedisUrl(const std::string& url);

// OK if `record` is one that ParseHolderRecord accepts: a node never stores what readers refuse.
Status CheckRecord(const HolderRecord& record);

std::unique_ptr<Registry> MakeEmbeddedRegistry();
// NotSupported in a build without hiredis.
Result<std::unique_ptr<Registry>> MakeRedisRegistry(const std::string& url, const RedisEndpoint& endpoint,
                                                    const RegistryOptions& options);

// Redis key layout (docs/ARCHITECTURE.md "Registry"). Model names hold no ':' (ValidateModelName).
std::string RecordKey(const std::string& model, uint64_t version, const std::string& node_id);
std::string IndexKey(const std::string& model);
std::string NodeKey(const std::string& node_id);  // the node's liveness: its pid, PX ttl
std::string IndexMember(uint64_t version, const std::string& node_id);
// Channels are global to a Redis server (not per database): the database is part of the name.
std::string AnnounceChannel(int db, const std::string& model);

}  // namespace viper::registry_internal
