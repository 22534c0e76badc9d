// The embedded backend: one catalog per process, shared by every Registry handle opened on
// "embedded". Records expire like Redis keys (checked when read); announcements are delivered on
// the announcing thread.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "registry_internal.h"

namespace viper::registry_internal {
namespace {

using Clock = std::chrono::steady_clock;

// One watch's delivery: `mu` is held while its handlers run, so the destructor can wait for a
// delivery in progress and no handler runs after it returns.
struct Delivery {
  std::mutex mu;
  bool alive = true;
  std::string model;
  WatchHandlers handlers;
};

struct Catalog {
  struct Entry {
    HolderRecord record;
    Clock::time_point deadline;
  };
  std::mutex mu;
  // model -> (version, node id) -> entry
  std::map<std::string, std::map<std::pair<uint64_t, std::string>, Entry>> models;
  std::vector<std::shared_ptr<Delivery>> watches;

  // Moves every live record of node `id` to `deadline`; false if it has none.
  bool RefreshLocked(const std::string& id, Clock::time_point deadline) {
    auto now = Clock::now();
    bool alive = false;
    for (auto& [model, entries] : models)
      for (auto& [key, entry] : entries)
        if (key.second == id && entry.deadline > now) {
          entry.deadline = deadline;
          alive = true;
        }
    return alive;
  }

  void ExpireLocked(const std::string& model) {
    auto it = models.find(model);
    if (it == models.end()) return;
    auto now = Clock::now();
    std::erase_if(it->second, [&](const auto& kv) { return kv.second.deadline <= now; });
    if (it->second.empty()) models.erase(it);
  }
};

Catalog& ProcessCatalog() {
  static Catalog* catalog = new Catalog;  // never destroyed: handles may outlive static destruction
  return *catalog;
}

class EmbeddedWatch : public RegistryWatch {
 public:
  explicit EmbeddedWatch(std::shared_ptr<Delivery> delivery) : delivery_(std::move(delivery)) {}
  ~EmbeddedWatch() override {
    Catalog& c = ProcessCatalog();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      std::erase(c.watches, delivery_);
    }
    std::lock_guard<std::mutex> lock(delivery_->mu);  // waits for a delivery in progress
    delivery_->alive = false;
  }

 private:
  std::shared_ptr<Delivery> delivery_;
};

class EmbeddedRegistry : public Registry {
 public:
  std::string_view backend() const override { return "embedded"; }
  const std::string& url() const override { return url_; }
  RegistryCapabilities capabilities() const override { return {.shared = false, .expiry = true, .watch = true}; }

  Result<size_t> Put(std::span<const HolderRecord> records, std::chrono::milliseconds ttl) override {
    for (const auto& r : records) VIPER_RETURN_IF_ERROR(CheckRecord(r));
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    size_t fresh = 0;
    for (const auto& r : records) {
      c.ExpireLocked(r.info.model);
      auto& slot = c.models[r.info.model][{r.info.version, r.node.id}];
      fresh += slot.record.info.version == 0;  // just made
      slot = {r, Clock::now() + ttl};
    }
    std::set<std::string> nodes;
    for (const auto& r : records) nodes.insert(r.node.id);
    for (const auto& id : nodes) c.RefreshLocked(id, Clock::now() + ttl);  // the TTL is the node's
    return fresh;
  }

  Result<bool> Refresh(const NodeRecord& node, std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) return Status::InvalidArgument("registry TTL must be positive");
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    return c.RefreshLocked(node.id, Clock::now() + ttl);
  }

  Status Remove(const std::string& node_id, const std::string& model, uint64_t version) override {
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.models.find(model); it != c.models.end()) it->second.erase({version, node_id});
    c.ExpireLocked(model);
    return Status::OK();
  }

  Status Announce(const HolderRecord& record) override {
    Catalog& c = ProcessCatalog();
    std::vector<std::shared_ptr<Delivery>> targets;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      for (const auto& w : c.watches)
        if (w->model == record.info.model) targets.push_back(w);
    }
    for (const auto& w : targets) {
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->alive && w->handlers.on_announce) w->handlers.on_announce(record);
    }
    return Status::OK();
  }

  Result<RegistryLookup> Lookup(const std::string& model) override {
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    c.ExpireLocked(model);
    RegistryLookup out;
    auto it = c.models.find(model);
    if (it == c.models.end()) return out;
    for (auto e = it->second.rbegin(); e != it->second.rend(); ++e) out.holders.push_back(e->second.record);
    return out;
  }

  Result<std::vector<std::string>> Models() override {
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    std::vector<std::string> names;
    for (const auto& [model, entries] : c.models) names.push_back(model);
    std::vector<std::string> live;
    for (const auto& model : names) {
      c.ExpireLocked(model);
      if (c.models.contains(model)) live.push_back(model);
    }
    return live;
  }

  Result<std::unique_ptr<RegistryWatch>> Watch(const std::string& model, WatchHandlers handlers) override {
    auto delivery = std::make_shared<Delivery>();
    delivery->model = model;
    delivery->handlers = std::move(handlers);
    Catalog& c = ProcessCatalog();
    std::lock_guard<std::mutex> lock(c.mu);
    c.watches.push_back(delivery);
    return std::unique_ptr<RegistryWatch>(new EmbeddedWatch(std::move(delivery)));
  }

 private:
  std::string url_ = "embedded";
};

}  // namespace

std::unique_ptr<Registry> MakeEmbeddedRegistry() { return std::make_unique<EmbeddedRegistry>(); }

}  // namespace viper::registry_internal
