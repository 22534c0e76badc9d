// Built instead of the Redis backend when hiredis was not found (VIPER_WITH_REDIS=AUTO).
#include "registry_internal.h"

namespace viper::registry_internal {

Result<std::unique_ptr<Registry>> MakeRedisRegistry(const std::string& url, const RedisEndpoint&,
                                                    const RegistryOptions&) {
  return Status::NotSupported("registry " + url + ": this build of Viper has no Redis backend "
                              "(apt-get install libhiredis-dev and rebuild with -DVIPER_WITH_REDIS=ON)");
}

}  // namespace viper::registry_internal
