// OpenRegistry: picks the backend from the URL; the URL parser and the Redis key layout.
#include <fmt/format.h>

#include "core/names.h"
#include "core/snapshot_internal.h"
#include "registry_internal.h"

namespace viper {
namespace registry_internal {

Result<RedisEndpoint> ParseRedisUrl(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("registry URL " + internal::Quote(url, 128) + ": " + why +
                                   " (expected redis://HOST:PORT[/DB])");
  };
  if (!url.starts_with(kScheme)) return bad("not a redis:// URL");
  std::string rest = url.substr(kScheme.size());
  RedisEndpoint ep;
  if (size_t slash = rest.find('/'); slash != std::string::npos) {
    std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (db.empty() || db.size() > 4 || db.find_first_not_of("0123456789") != std::string::npos)
      return bad("database '" + db.substr(0, 16) + "' is not a number 0-9999");
    ep.db = std::stoi(db);
  }
  if (rest.find('@') != std::string::npos) return bad("credentials in the URL are not supported");
  bool has_port = !rest.empty() && (rest.back() != ']' && rest.find(':') != std::string::npos);
  if (!has_port) rest += ":6379";
  auto parsed = ParseHostPort(rest);
  if (!parsed.ok()) return bad(parsed.status().message());
  if (parsed->second == 0) return bad("port 0");
  ep.host = parsed->first;
  ep.port = parsed->second;
  return ep;
}

Status CheckRecord(const HolderRecord& record) {
  auto parsed = ParseHolderRecord(EncodeHolderRecord(record));
  if (!parsed.ok())
    return Status::InvalidArgument("not registering " + record.info.model + " version " +
                                   std::to_string(record.info.version) + ": " + parsed.status().message());
  return Status::OK();
}

std::string RecordKey(const std::string& model, uint64_t version, const std::string& node_id) {
  return fmt::format("viper:rec:{}:{}:{}", model, version, node_id);
}
std::string IndexKey(const std::string& model) { return "viper:idx:" + model; }
std::string NodeKey(const std::string& node_id) { return "viper:node:" + node_id; }
std::string IndexMember(uint64_t version, const std::string& node_id) { return fmt::format("{}:{}", version, node_id); }
std::string AnnounceChannel(int db, const std::string& model) { return fmt::format("viper:{}:announce:{}", db, model); }

}  // namespace registry_internal

Result<std::unique_ptr<Registry>> OpenRegistry(const std::string& url, const RegistryOptions& options) {
  if (url == "embedded") return registry_internal::MakeEmbeddedRegistry();
  if (url.starts_with("redis://")) {
    VIPER_ASSIGN_OR_RETURN(auto endpoint, registry_internal::ParseRedisUrl(url));
    return registry_internal::MakeRedisRegistry(url, endpoint, options);
  }
  return Status::InvalidArgument("registry URL " + internal::Quote(url, 128) +
                                 " names no backend: use \"embedded\" or redis://HOST:PORT[/DB]");
}

Result<RegistryLookup> Registry::LookupLatest(const std::string& model) {
  VIPER_ASSIGN_OR_RETURN(RegistryLookup out, Lookup(model));
  if (!out.holders.empty())
    std::erase_if(out.holders, [top = out.holders[0].info.version](const HolderRecord& h) { return h.info.version != top; });
  return out;
}

Result<Placement> Registry::Join(const JoinRequest&) {
  return Status::NotSupported("registry " + url() + " does not place relays (use redis://)");
}
Result<bool> Registry::Stay(const std::string&, const std::string&, std::chrono::milliseconds) {
  return Status::NotSupported("registry " + url() + " does not place relays (use redis://)");
}
Status Registry::Leave(const std::string&, const std::string&) {
  return Status::NotSupported("registry " + url() + " does not place relays (use redis://)");
}

}  // namespace viper
