// Placement on Redis (Registry::Join, Stay, Leave). Layout (docs/ARCHITECTURE.md "Placement and
// healing"):
//   viper:tree:<model>         ZSET, member node id, score the membership's expiry (ms, Redis TIME)
//   viper:tree:<model>:<id>    HASH a=address h=host_key p=parent id d=depth c=children it takes,
//                              PX ttl
// Each verb is one Lua script, so a join reads the loads and takes the slot in one atomic step.
#pragma once

#include "redis_connection.h"

namespace viper::registry_internal {

Result<Placement> JoinOn(RedisConnection& c, const JoinRequest& request);
Result<bool> StayOn(RedisConnection& c, const std::string& model, const std::string& node_id,
                    std::chrono::milliseconds ttl);
Status LeaveOn(RedisConnection& c, const std::string& model, const std::string& node_id);

}  // namespace viper::registry_internal
