#include "registry_agent.h"

#include "viper/log.h"

namespace viper::internal {
namespace {
constexpr std::string_view kLog = "registry";
using Clock = std::chrono::steady_clock;
}  // namespace

RegistryAgent::RegistryAgent(std::unique_ptr<Registry> registry, NodeRecord self, RegistryHeartbeat heartbeat,
                             Catalog catalog)
    : registry_(std::move(registry)), self_(std::move(self)), heartbeat_(heartbeat), catalog_(std::move(catalog)) {}

std::unique_ptr<RegistryAgent> RegistryAgent::Start(std::unique_ptr<Registry> registry, NodeRecord self,
                                                     RegistryHeartbeat heartbeat, Catalog catalog) {
  std::unique_ptr<RegistryAgent> agent(
      new RegistryAgent(std::move(registry), std::move(self), heartbeat, std::move(catalog)));
  agent->stats_.reachable = true;  // until the first pass says otherwise (so that it warns)
  agent->thread_ = std::thread([raw = agent.get()] { raw->Run(); });
  return agent;
}

RegistryAgent::~RegistryAgent() { Stop(); }

void RegistryAgent::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Withdraw();
}

void RegistryAgent::Announce(const proto::VersionInfo& info) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    to_announce_.insert(info.model);
    changed_ = true;
  }
  cv_.notify_all();
}

void RegistryAgent::CatalogChanged() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = true;
  }
  cv_.notify_all();
}

RegistryAgentStats RegistryAgent::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RegistryAgent::Run() {
  auto next_full = Clock::now();  // the first pass registers everything
  bool announce_all = true;       // first pass and after an outage: the newest of each model
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_until(lock, next_full, [&] { return stop_ || changed_; });
    if (stop_) return;
    bool full = Clock::now() >= next_full;
    changed_ = false;
    bool was_reachable = stats_.reachable;
    lock.unlock();
    Status st = Sync(full, announce_all);
    lock.lock();
    if (full || !st.ok()) next_full = Clock::now() + heartbeat_.interval;  // else the heartbeat stays due
    if (!st.ok()) {
      stats_.failures++;
      stats_.reachable = false;
      announce_all = true;
      if (was_reachable && st.code() == StatusCode::kUnavailable)
        log(LogLevel::kWarn, kLog, "{} is unreachable ({}); this node keeps serving what it holds and retries every {} ms",
            registry_->url(), st.message(), heartbeat_.interval.count());
      else if (was_reachable)
        log(LogLevel::kError, kLog, "cannot register in {}: {}; retrying every {} ms", registry_->url(), st.message(),
            heartbeat_.interval.count());
      continue;
    }
    stats_.passes++;
    stats_.reachable = true;
    if (!was_reachable) {
      stats_.reregistrations++;
      log(LogLevel::kWarn, kLog, "{} is reachable again: {} version(s) of this node registered again", registry_->url(),
          registered_.size());
    }
    announce_all = false;
  }
}

// REQUIRES: agent thread.
Status RegistryAgent::Sync(bool full, bool announce_all) {
  if (!registered_.empty()) {
    // Every pass starts with the heartbeat: one command refreshes every record; they are put
    // again only if the registry lost them (a restarted Redis, or heartbeats that did not reach
    // it within the TTL). Before a pass's puts too, which would otherwise make a restarted Redis
    // hold this node's key again without the records put before.
    Result<bool> alive = registry_->Refresh(self_, heartbeat_.ttl);
    if (!alive.ok()) {
      registered_.clear();  // unreachable: everything is put again when it is back (as after a failed put)
      return alive.status();
    }
    if (*alive) {
      full = false;
    } else {
      log(LogLevel::kWarn, kLog, "{} had lost this node's {} record(s); registering them again", registry_->url(),
          registered_.size());
      registered_.clear();
      announce_all = true;
    }
  }
  // The announcements asked for so far are taken before the catalog is read: the node lists a
  // version in its catalog before it calls Announce, so each of these models' new version is in
  // the catalog read below, and one announced while this pass runs waits for the next pass (which
  // Announce makes due). Taken after the read (as before), an Announce that came in between named
  // a version the pass's catalog lacked, and the pass dropped it as "no longer held": the version
  // was registered by the next pass but never announced, and a consumer that found no holder at
  // start (it waits for the watch, without polling) never heard of it (test_network_trust's
  // password-file case under CI's load; RegistryAgent.AnAnnounceDuringAPassIsNotLost).
  std::set<std::string> models;
  {
    std::lock_guard<std::mutex> lock(mu_);
    models.swap(to_announce_);
  }
  std::map<Key, proto::VersionInfo> now;
  std::map<std::string, const proto::VersionInfo*> newest;
  for (auto& info : catalog_()) {
    auto& slot = now[Key{info.model, info.version}] = std::move(info);
    auto& n = newest[slot.model];
    if (n == nullptr || n->version < slot.version) n = &slot;
  }
  std::vector<HolderRecord> puts;
  size_t known = 0;  // records put now that we had put before: the registry must still have them
  for (auto it = now.begin(); it != now.end();) {
    auto before = registered_.find(it->first);
    bool changed = before == registered_.end() || !(before->second == it->second);
    // A record is validated when it is new or changed (a registered one passed already): a full
    // pass re-puts every record, and validating each (a JSON encode and parse) took most of an
    // ASan producer's registry thread with ~4,000 versions on file.
    if (Status valid = changed ? ParseHolderRecord(EncodeHolderRecord({self_, it->second})).status() : Status::OK();
        !valid.ok()) {
      if (refused_.insert(it->first).second)  // once per version
        log(LogLevel::kError, kLog, "not registering {} version {}: {}", it->first.first, it->first.second,
            valid.message());
      if (newest[it->first.first] == &it->second) newest.erase(it->first.first);
      it = now.erase(it);
      continue;
    }
    if (full || changed) {
      puts.push_back({self_, it->second});
      known += before != registered_.end();
    }
    ++it;
  }
  auto fresh = registry_->Put(puts, heartbeat_.ttl);
  Status st = fresh.status();
  if (st.ok() && *fresh + known > puts.size()) {
    // Records we had put were gone: the registry restarted empty, was flushed, or our heartbeats
    // did not reach it in time. They are back now; watchers may have missed announcements.
    log(LogLevel::kWarn, kLog, "{} had lost {} of this node's records; registered again", registry_->url(),
        *fresh + known - puts.size());
    announce_all = true;
  }
  for (auto it = registered_.begin(); st.ok() && it != registered_.end(); ++it)
    if (!now.contains(it->first)) st = registry_->Remove(self_.id, it->first.first, it->first.second);
  if (!st.ok()) {
    registered_.clear();  // unknown what landed: everything is put again next time
    std::lock_guard<std::mutex> lock(mu_);
    to_announce_.insert(models.begin(), models.end());  // and announced then
    return st;
  }
  registered_ = now;
  if (announce_all)
    for (const auto& [model, info] : newest) models.insert(model);
  for (auto it = models.begin(); it != models.end(); ++it) {
    auto n = newest.find(*it);
    if (n == newest.end()) continue;  // no longer held
    Status announced = registry_->Announce({self_, *n->second});
    std::lock_guard<std::mutex> lock(mu_);
    if (!announced.ok()) {
      to_announce_.insert(it, models.end());  // these wait for the next pass
      return announced;
    }
    stats_.announced++;
  }
  return Status::OK();
}

void RegistryAgent::Withdraw() {
  for (const auto& [key, info] : registered_) {
    if (Status st = registry_->Remove(self_.id, key.first, key.second); !st.ok()) {
      log(LogLevel::kInfo, kLog, "could not withdraw this node's records from {} ({}); they expire in {} ms",
          registry_->url(), st.message(), heartbeat_.ttl.count());
      return;
    }
  }
  registered_.clear();
}

}  // namespace viper::internal
