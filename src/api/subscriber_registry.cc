// The subscriber's side of a shared registry (SubscriberOptions::registry): discovery of the
// nearest holder, announcements heard through the registry, and the choice of node to connect to.
// The node's own NOTIFY stays the fast path; OnAnnounce drops what was heard already, so a version
// heard of twice (node and registry) is loaded once.
#include "seal.h"
#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
}  // namespace

Status Subscriber::Impl::StartRegistry() {
  if (options.registry.empty()) return Status::OK();
  host_key = LocalHostKey();
  VIPER_ASSIGN_OR_RETURN(registry, OpenRegistry(options.registry, RegistryOptions{.password = options.registry_password}));
  if (!registry->capabilities().watch) return Status::NotSupported("registry " + options.registry + " cannot watch");
  WatchHandlers handlers;
  handlers.on_announce = [this](const HolderRecord& r) { OnRegistryAnnounce(r); };
  handlers.on_resync = [this] {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (registry_down) log(LogLevel::kWarn, kLog, "registry {} is reachable again", options.registry);
      registry_down = false;
    }
    Rediscover();
  };
  handlers.on_error = [this](const Status& why) { OnRegistryError(why); };
  auto watch = registry->Watch(options.model, std::move(handlers));
  if (!watch.ok()) return watch.status().WithContext("subscriber of " + options.model);
  registry_watch = std::move(watch).value();
  Rediscover();
  return Status::OK();
}

// Malformed announcements are logged each (they are rare and each is a fault worth seeing); a lost
// connection once per outage.
void Subscriber::Impl::OnRegistryError(const Status& why) {
  if (why.code() == StatusCode::kUnavailable) {
    std::lock_guard<std::mutex> lock(mu);
    if (registry_down) return;
    registry_down = true;
    log(LogLevel::kWarn, kLog, "{}; announcements from node {} go on, the registry is retried", why.message(),
        node_address.empty() ? "(none yet)" : node_address);
    return;
  }
  log(LogLevel::kWarn, kLog, "ignored: {}", why.message());
}

// The announcing node becomes the one to connect to when there is none, when ours is gone, or when
// it is on this host and ours is not (its segments can be mapped).
void Subscriber::Impl::OnRegistryAnnounce(const HolderRecord& record) {
  // A holder outside the fleet (its version not sealed with the fleet's token) is never chosen.
  if (Status sealed = internal::CheckSeal(options.token, record.info, "node " + record.node.address); !sealed.ok()) {
    log(LogLevel::kWarn, kLog, "skipped: {}", sealed.message());
    return;
  }
  std::shared_ptr<Client> dropped;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu);
    bool connected = client && client->connected();
    bool near = registry_node_host_key == host_key;
    if (registry_node.empty() || !connected ||
        (!near && record.node.host_key == host_key && record.node.address != registry_node)) {
      if (connected && record.node.address != registry_node) {
        log(LogLevel::kInfo, kLog, "{}: node {} on this host holds it too: switching from {}", options.model,
            record.node.address, registry_node);
        dropped = std::move(client);
        cv.notify_all();  // the loader (waiting for a version or a lost connection) connects there now
      }
      registry_node = record.node.address;
      registry_node_host_key = record.node.host_key;
    }
  }
  OnAnnounce(record.info, false, record.node.address);
}

void Subscriber::Impl::DropUnsealed(RegistryLookup* found) const {
  std::erase_if(found->holders, [&](const HolderRecord& h) {
    Status sealed = internal::CheckSeal(options.token, h.info, "node " + h.node.address);
    if (!sealed.ok()) log(LogLevel::kWarn, kLog, "holder skipped: {}", sealed.message());
    return !sealed.ok();
  });
}

void Subscriber::Impl::Rediscover() {
  auto found = registry->LookupLatest(options.model);
  if (!found.ok()) {
    OnRegistryError(found.status().WithContext("registry lookup of " + options.model));
    return;
  }
  for (const auto& rejected : found->rejected) log(LogLevel::kWarn, kLog, "registry record ignored: {}", rejected);
  DropUnsealed(&*found);
  if (found->holders.empty()) {  // none of the newest version's records is sealed: every holding
    found = registry->Lookup(options.model);
    if (!found.ok()) return OnRegistryError(found.status().WithContext("registry lookup of " + options.model));
    DropUnsealed(&*found);
  }
  auto nearest = NearestHoldersOfLatest(*found, host_key);
  if (nearest.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (registry_node.empty())
      registry_node = nearest.front().node.address, registry_node_host_key = nearest.front().node.host_key;
  }
  OnAnnounce(nearest.front().info, false, nearest.front().node.address);
}

Result<std::unique_ptr<Client>> Subscriber::Impl::ConnectViaRegistry(const ClientHandlers& handlers,
                                                                     std::string* address, const std::string& last) {
  std::string first, first_key;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = registry_node;
    first_key = registry_node_host_key;
  }
  // Nothing announced yet: the watch says when a node holds the model (no polling meanwhile).
  if (first.empty()) return Status::NotFound("no node holds " + options.model + " in registry " + options.registry + " yet");
  auto attempt = [&](const std::string& node, const std::string& key) -> Result<std::unique_ptr<Client>> {
    auto c = Client::Connect(ClientOptionsFor(node), handlers);
    if (!c.ok()) return c.status();
    std::lock_guard<std::mutex> lock(mu);
    registry_node = node;
    registry_node_host_key = key;
    *address = node;
    return c;
  };
  // A node the liveness probe gave up on (`last`) would wait out the connect timeout: tried after the others.
  const std::string silent = first == last ? first : "";
  const std::string silent_key = first_key;
  Result<std::unique_ptr<Client>> c = Status::Unavailable("node " + first + " did not answer a liveness probe");
  if (silent.empty()) c = attempt(first, first_key);
  if (c.ok()) return c;
  Status failed = c.status();
  // That node does not answer (gone, its records linger until their TTL; or a record that names a
  // dead or foreign address): every other holder in turn, newest version and nearest first; one
  // that holds an older version still serves that, and NOTIFY brings the rest.
  auto found = registry->Lookup(options.model);
  if (!found.ok()) return silent.empty() ? failed.WithContext(found.status().message()) : attempt(silent, silent_key);
  DropUnsealed(&*found);
  const std::string named = first;
  for (const auto& holder : HoldersInOrder(*found, host_key)) {
    if (holder.node.address == named) continue;
    log(LogLevel::kWarn, kLog, "{}: holder {} did not answer ({}); trying holder {}", options.model, first,
        failed.message(), holder.node.address);
    if (auto other = attempt(holder.node.address, holder.node.host_key); other.ok()) return other;
    else failed = other.status(), first = holder.node.address;
  }
  if (!silent.empty()) return attempt(silent, silent_key);
  return failed;
}

}  // namespace viper
