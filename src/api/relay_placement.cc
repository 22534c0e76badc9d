#include "relay_placement.h"

#include <utility>

#include "viper/log.h"

namespace viper::internal {

namespace {
constexpr std::string_view kLog = "relay";
}  // namespace

Result<std::unique_ptr<RelayPlacement>> RelayPlacement::Start(std::unique_ptr<Registry> registry,
                                                              RelayPlacementOptions options) {
  if (!registry->capabilities().placement)
    return Status::NotSupported("relay: registry " + registry->url() +
                                " cannot place relays (a relay without --upstream needs redis://)");
  const RegistryHeartbeat& hb = options.heartbeat;
  if (hb.ttl.count() <= 0 || hb.interval.count() <= 0 || hb.interval >= hb.ttl)
    return Status::InvalidArgument("relay: heartbeat interval must be positive and shorter than the TTL");
  std::unique_ptr<RelayPlacement> out(new RelayPlacement(std::move(registry), std::move(options)));
  out->thread_ = std::thread([raw = out.get()] { raw->Run(); });
  return out;
}

RelayPlacement::RelayPlacement(std::unique_ptr<Registry> registry, RelayPlacementOptions options)
    : registry_(std::move(registry)), options_(std::move(options)) {}

RelayPlacement::~RelayPlacement() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (Status st = registry_->Leave(options_.model, options_.self.id); !st.ok())
    log(LogLevel::kWarn, kLog, "{}: leaving the relay tree: {} (the slot frees itself after the TTL)", options_.model,
        st.message());
}

uint64_t RelayPlacement::joins() const {
  std::lock_guard<std::mutex> lock(mu_);
  return joins_;
}

Result<std::string> RelayPlacement::Choose(const std::string& unreachable) {
  std::unique_lock<std::mutex> lock(mu_);
  // A lost connection to a parent that may be up (a broken transfer drops a live one's too): it
  // is tried again; one that did not answer is avoided.
  if (!parent_.empty() && unreachable != parent_) return parent_;
  auto now = std::chrono::steady_clock::now();
  if (!unreachable.empty()) avoid_[unreachable] = now + options_.heartbeat.ttl;
  if (!parent_.empty()) lost_ = std::exchange(parent_, "");
  std::erase_if(avoid_, [&](const auto& entry) { return entry.second <= now; });
  VIPER_ASSIGN_OR_RETURN(Placement placed, JoinLocked(lock));
  parent_ = placed.parent.address;
  joins_++;
  std::string previous = std::exchange(lost_, "");
  // A re-join is a warning: the parent died or does not answer.
  log(previous.empty() ? LogLevel::kInfo : LogLevel::kWarn, kLog, "{}: {} the relay tree under {} (depth {}, its child {}){}",
      options_.model, previous.empty() ? "joined" : "re-joined", parent_, placed.depth, placed.siblings + 1,
      previous.empty() ? "" : "; " + previous + " did not answer");
  return parent_;
}

// The roots are the holders of the newest version outside the tree; the script skips members.
Result<Placement> RelayPlacement::JoinLocked(std::unique_lock<std::mutex>&) {
  JoinRequest request;
  request.model = options_.model;
  request.node = options_.self;
  request.max_children = options_.max_children;
  request.ttl = options_.heartbeat.ttl;
  request.prefer = parent_;
  for (const auto& [address, until] : avoid_) request.avoid.push_back(address);
  VIPER_ASSIGN_OR_RETURN(RegistryLookup found, registry_->LookupLatest(options_.model));
  for (const auto& h : found.holders)
    if (h.node.id != options_.self.id && request.roots.size() < 64) request.roots.push_back(h.node);
  if (request.roots.empty())
    return Status::NotFound("relay: no node holds " + options_.model + " in registry " + registry_->url() + " yet");
  return registry_->Join(request);
}

// The membership's heartbeat. A membership the registry lost (expired while the registry was out
// of reach, or a restarted Redis) is taken again under the same parent when it has room.
void RelayPlacement::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  bool warned = false;
  while (!cv_.wait_for(lock, options_.heartbeat.interval, [&] { return stop_; })) {
    if (parent_.empty()) continue;
    auto stay = registry_->Stay(options_.model, options_.self.id, options_.heartbeat.ttl);
    if (stay.ok() && !*stay) {
      auto placed = JoinLocked(lock);
      if (placed.ok() && placed->parent.address != parent_)
        log(LogLevel::kWarn, kLog, "{}: the registry lost this relay's place; taken again under {}, connected to {}",
            options_.model, placed->parent.address, parent_);
      stay = placed.ok() ? Result<bool>(true) : Result<bool>(placed.status());
    }
    if (!stay.ok() && !warned)
      log(LogLevel::kWarn, kLog, "{}: relay tree heartbeat: {} (retried)", options_.model, stay.status().message());
    warned = !stay.ok();
  }
}

}  // namespace viper::internal
