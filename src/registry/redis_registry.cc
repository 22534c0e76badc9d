// The Redis backend. Layout (docs/ARCHITECTURE.md "Registry"):
//   viper:node:<node id>                    STRING, the node's pid, PX ttl: the node is alive
//   viper:rec:<model>:<version>:<node id>   STRING, the HolderRecord JSON (no TTL)
//   viper:idx:<model>                       ZSET, member "<version>:<node id>", score version (no TTL)
//   channel viper:<db>:announce:<model>     PUBLISH of the HolderRecord JSON
// The heartbeat refreshes only the node key, so its cost does not grow with the versions held. A
// record counts while its node key holds the pid the record names; a lookup that finds one whose
// node is gone (or was restarted) removes it and its index member (PruneScript, which checks again
// inside Redis so that a node putting it back meanwhile keeps it).
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/names.h"
#include "core/snapshot_internal.h"
#include "redis_connection.h"
#include "redis_placement.h"

namespace viper::registry_internal {
namespace {

constexpr size_t kMaxLookupHoldings = 4096;  // index members read per lookup
constexpr size_t kMaxScanKeys = 1u << 16;    // index keys listed by Models()

// "<version>:<16 hex>" -> (version, node id); nullopt if it is not that.
std::optional<std::pair<uint64_t, std::string>> ParseMember(std::string_view member) {
  size_t colon = member.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 20 || member.size() - colon - 1 != 16) return std::nullopt;
  std::string_view digits = member.substr(0, colon), id = member.substr(colon + 1);
  if (digits.find_first_not_of("0123456789") != std::string_view::npos || digits[0] == '0') return std::nullopt;
  if (id.find_first_not_of("0123456789abcdef") != std::string_view::npos) return std::nullopt;
  uint64_t version = 0;
  for (char c : digits) {
    if (version > (UINT64_MAX - 9) / 10) return std::nullopt;
    version = version * 10 + static_cast<uint64_t>(c - '0');
  }
  return std::make_pair(version, std::string(id));
}

// KEYS = [index, rec1, node1, rec2, node2, ...]; ARGV = [member1, pid1, seen1, ...]: a member goes
// (with its record) if its record is still the one the lookup read (`seen`, "" = none) and the
// node key does not hold the record's pid.
constexpr const char* kPruneScript = R"lua(
for j = 0, #ARGV / 3 - 1 do
  local rec = redis.call('GET', KEYS[2 + 2 * j])
  local live = redis.call('GET', KEYS[3 + 2 * j])
  local seen = ARGV[3 + 3 * j]
  if (rec == false and seen == '') or (rec == seen and live ~= ARGV[2 + 3 * j]) then
    redis.call('ZREM', KEYS[1], ARGV[1 + 3 * j])
    if rec then redis.call('DEL', KEYS[2 + 2 * j]) end
  end
end
return 0
)lua";

// A record is stored under the key its own fields name; anything else was written by someone else.
Status MatchesKey(const HolderRecord& r, const std::string& model, uint64_t version, const std::string& id) {
  if (r.info.model == model && r.info.version == version && r.node.id == id) return Status::OK();
  return Status::Corruption(fmt::format("registry record: names {} version {} node {}, stored under another key",
                                        internal::Quote(r.info.model), r.info.version, internal::Quote(r.node.id)));
}

class RedisWatch;

class RedisRegistry : public Registry {
 public:
  RedisRegistry(std::string url, RedisEndpoint endpoint, RegistryOptions options)
      : url_(std::move(url)), endpoint_(std::move(endpoint)), options_(options) {}

  std::string_view backend() const override { return "redis"; }
  const std::string& url() const override { return url_; }
  RegistryCapabilities capabilities() const override {
    return {.shared = true, .expiry = true, .watch = true, .placement = true};
  }

  Result<size_t> Put(std::span<const HolderRecord> records, std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) return Status::InvalidArgument("registry TTL must be positive");
    std::map<std::string, std::string> nodes;  // id -> pid, each node's liveness key set after its records
    std::vector<Command> commands;
    for (const auto& r : records) {
      VIPER_RETURN_IF_ERROR(CheckRecord(r));
      nodes.emplace(r.node.id, std::to_string(r.node.pid));
    }
    if (records.empty()) return size_t{0};
    for (const auto& [id, pid] : nodes) commands.push_back({"GET", NodeKey(id)});
    for (const auto& r : records) {
      const auto& m = r.info.model;
      std::string key = RecordKey(m, r.info.version, r.node.id);
      commands.push_back({"EXISTS", key});
      commands.push_back({"SET", key, EncodeHolderRecord(r)});
      commands.push_back({"ZADD", IndexKey(m), std::to_string(r.info.version), IndexMember(r.info.version, r.node.id)});
    }
    std::string px = std::to_string(ttl.count());
    for (const auto& [id, pid] : nodes) commands.push_back({"SET", NodeKey(id), pid, "PX", px});
    return WithConnection<size_t>([&](RedisConnection& c) -> Result<size_t> {
      VIPER_ASSIGN_OR_RETURN(auto replies, RunChecked(c, commands, "registering"));
      std::set<std::string> lost;  // nodes whose records did not count before this Put
      size_t i = 0;
      for (const auto& [id, pid] : nodes) {
        const redisReply* live = replies[i++].get();
        if (live->type != REDIS_REPLY_STRING || std::string_view(live->str, live->len) != pid) lost.insert(id);
      }
      size_t fresh = 0;
      for (const auto& r : records) {
        fresh += lost.contains(r.node.id) || (replies[i]->type == REDIS_REPLY_INTEGER && replies[i]->integer == 0);
        i += 3;
      }
      return fresh;
    });
  }

  Result<bool> Refresh(const NodeRecord& node, std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) return Status::InvalidArgument("registry TTL must be positive");
    // XX: a node key that expired stays gone, so that the node puts its records again.
    Command refresh = {"SET", NodeKey(node.id), std::to_string(node.pid), "PX", std::to_string(ttl.count()), "XX"};
    return WithConnection<bool>([&](RedisConnection& c) -> Result<bool> {
      VIPER_ASSIGN_OR_RETURN(auto replies, RunChecked(c, {refresh}, "refreshing"));
      return replies[0]->type == REDIS_REPLY_STATUS;  // +OK; nil: the key was not there
    });
  }

  Status Remove(const std::string& node_id, const std::string& model, uint64_t version) override {
    return RunAll({{"DEL", RecordKey(model, version, node_id)}, {"ZREM", IndexKey(model), IndexMember(version, node_id)}},
                  "removing");
  }

  Result<Placement> Join(const JoinRequest& request) override {
    return WithConnection<Placement>([&](RedisConnection& c) { return JoinOn(c, request); });
  }
  Result<bool> Stay(const std::string& model, const std::string& node_id, std::chrono::milliseconds ttl) override {
    return WithConnection<bool>([&](RedisConnection& c) { return StayOn(c, model, node_id, ttl); });
  }
  Status Leave(const std::string& model, const std::string& node_id) override {
    return WithConnection<bool>([&](RedisConnection& c) -> Result<bool> {
             VIPER_RETURN_IF_ERROR(LeaveOn(c, model, node_id));
             return true;
           })
        .status();
  }

  Status Announce(const HolderRecord& record) override {
    VIPER_RETURN_IF_ERROR(CheckRecord(record));
    return RunAll({{"PUBLISH", AnnounceChannel(endpoint_.db, record.info.model), EncodeHolderRecord(record)}},
                  "announcing");
  }

  Result<RegistryLookup> Lookup(const std::string& model) override {
    VIPER_RETURN_IF_ERROR(ValidateModelName(model));
    return WithConnection<RegistryLookup>([&](RedisConnection& c) { return LookupOn(c, model); });
  }

  Result<std::vector<std::string>> Models() override {
    return WithConnection<std::vector<std::string>>([&](RedisConnection& c) { return ModelsOn(c); });
  }

  Result<std::unique_ptr<RegistryWatch>> Watch(const std::string& model, WatchHandlers handlers) override;
  Result<RegistryLookup> LookupLatest(const std::string& model) override {
    VIPER_RETURN_IF_ERROR(ValidateModelName(model));
    return WithConnection<RegistryLookup>([&](RedisConnection& c) -> Result<RegistryLookup> {
      // The newest members first; all of them (as Lookup) only if that page does not hold every
      // live holder of the newest live version (more holders than a page, or all dead).
      constexpr size_t kPage = 256;
      size_t read = 0;
      VIPER_ASSIGN_OR_RETURN(RegistryLookup out, LookupOn(c, model, kPage, &read));
      bool complete = read < kPage || (!out.holders.empty() && out.holders.back().info.version < out.holders[0].info.version);
      if (!complete) {  // every member of the newest live version (or, with none live, every member)
        std::string top = out.holders.empty() ? "+inf" : std::to_string(out.holders[0].info.version);
        VIPER_ASSIGN_OR_RETURN(out, LookupOn(c, model, kMaxLookupHoldings, nullptr, top, out.holders.empty() ? "-inf" : top));
      }
      if (!out.holders.empty()) std::erase_if(out.holders, [top = out.holders[0].info.version](const HolderRecord& h) { return h.info.version != top; });
      return out;
    });
  }

 private:
  // The holdings of the `count` newest index members with versions in [min, max]; `read` =
  // members returned by Redis.
  Result<RegistryLookup> LookupOn(RedisConnection& conn, const std::string& model, size_t count = kMaxLookupHoldings,
                                  size_t* read = nullptr, const std::string& max = "+inf", const std::string& min = "-inf") {
    RedisConnection* c = &conn;
    auto members = c->Run({"ZREVRANGEBYSCORE", IndexKey(model), max, min, "LIMIT", "0", std::to_string(count)});
    if (!members.ok()) return members.status();
    VIPER_RETURN_IF_ERROR(ExpectArray(members->get(), "index of " + model, kMaxLookupHoldings));
    if (read != nullptr) *read = (*members)->elements;
    RegistryLookup out;
    std::vector<std::pair<uint64_t, std::string>> holdings;
    Command mget = {"MGET"};
    for (size_t i = 0; i < (*members)->elements; ++i) {
      auto text = ExpectString((*members)->element[i], "index member");
      auto parsed = text.ok() ? ParseMember(*text) : std::nullopt;
      if (!parsed) {
        out.rejected.push_back(IndexKey(model) + ": member " +
                               (text.ok() ? internal::Quote(*text) : std::string("?")) + " is not <version>:<node id>");
        continue;
      }
      mget.push_back(RecordKey(model, parsed->first, parsed->second));
      holdings.push_back(std::move(*parsed));
    }
    if (holdings.empty()) return out;
    std::map<std::string, size_t> node_slot;  // node id -> its liveness key's place after the records
    std::vector<std::string> node_keys;
    for (const auto& [version, id] : holdings)
      if (node_slot.emplace(id, node_keys.size()).second) node_keys.push_back(NodeKey(id));
    mget.insert(mget.end(), node_keys.begin(), node_keys.end());
    const size_t expected = holdings.size() + node_keys.size();
    auto values = c->Run(mget);
    if (!values.ok()) return values.status();
    VIPER_RETURN_IF_ERROR(ExpectArray(values->get(), "MGET of " + model + "'s records", expected));
    if ((*values)->elements != expected) return Status::Corruption("MGET returned the wrong number of values");
    Command prune = {"EVAL", kPruneScript, "0"};  // the key count is filled in below
    Command prune_args;
    auto dead = [&](size_t i, const std::string& pid, std::string seen) {
      const auto& [version, id] = holdings[i];
      prune.push_back(mget[i + 1]);
      prune.push_back(NodeKey(id));
      prune_args.insert(prune_args.end(), {IndexMember(version, id), pid, std::move(seen)});
    };
    prune.push_back(IndexKey(model));
    for (size_t i = 0; i < holdings.size(); ++i) {
      const auto& [version, id] = holdings[i];
      const redisReply* v = (*values)->element[i];
      if (v->type == REDIS_REPLY_NIL) {  // removed since the index was read
        dead(i, "", "");
        continue;
      }
      auto text = ExpectString(v, mget[i + 1]);
      Result<HolderRecord> record = text.ok() ? ParseHolderRecord(*text) : Result<HolderRecord>(text.status());
      Status st = record.ok() ? MatchesKey(*record, model, version, id) : record.status();
      if (!st.ok()) {
        out.rejected.push_back(mget[i + 1] + ": " + st.message());
        continue;
      }
      std::string pid = std::to_string(record->node.pid);
      const redisReply* live = (*values)->element[holdings.size() + node_slot[id]];
      if (live->type != REDIS_REPLY_STRING || std::string_view(live->str, live->len) != pid) {
        dead(i, pid, std::string(*text));  // its node's TTL passed, or the node was restarted since
        continue;
      }
      out.holders.push_back(std::move(record).value());
    }
    if (!prune_args.empty()) {
      prune[2] = std::to_string(prune.size() - 3);
      prune.insert(prune.end(), prune_args.begin(), prune_args.end());
      auto pruned = c->Run(prune);
      if (!pruned.ok()) return pruned.status();
    }
    return out;
  }

  Result<std::vector<std::string>> ModelsOn(RedisConnection& conn) {
    RedisConnection* c = &conn;
    std::vector<std::string> models;
    std::string cursor = "0";
    do {
      auto page = c->Run({"SCAN", cursor, "MATCH", "viper:idx:*", "COUNT", "1000"});
      if (!page.ok()) return page.status();
      VIPER_RETURN_IF_ERROR(ExpectArray(page->get(), "SCAN", 2));
      if ((*page)->elements != 2) return Status::Corruption("SCAN: expected [cursor, keys]");
      VIPER_ASSIGN_OR_RETURN(std::string_view next, ExpectString((*page)->element[0], "SCAN cursor"));
      cursor = std::string(next);
      const redisReply* keys = (*page)->element[1];
      VIPER_RETURN_IF_ERROR(ExpectArray(keys, "SCAN keys", kMaxScanKeys));
      for (size_t i = 0; i < keys->elements && models.size() < kMaxScanKeys; ++i) {
        auto key = ExpectString(keys->element[i], "SCAN key");
        if (!key.ok() || !key->starts_with("viper:idx:")) continue;
        std::string model(key->substr(10));
        if (ValidateModelName(model).ok()) models.push_back(std::move(model));  // others are not ours
      }
    } while (cursor != "0" && models.size() < kMaxScanKeys);
    std::sort(models.begin(), models.end());
    models.erase(std::unique(models.begin(), models.end()), models.end());
    // An index outlives its holders until a lookup prunes it: this one. A model whose records are
    // malformed stays listed, so that its lookup names them.
    std::vector<std::string> live;
    for (auto& model : models) {
      VIPER_ASSIGN_OR_RETURN(RegistryLookup found, LookupOn(conn, model));
      if (!found.holders.empty() || !found.rejected.empty()) live.push_back(std::move(model));  // malformed: shown
    }
    return live;
  }

  // Runs `fn` on the connection, connecting first if there is none. An I/O failure leaves the
  // connection unusable: it is dropped, and when it was an old one (the server may have restarted
  // since) `fn` runs once more on a fresh one. Every command here may safely run twice.
  template <typename T, typename Fn>
  Result<T> WithConnection(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int attempt = 0;; ++attempt) {
      bool fresh = conn_ == nullptr;
      if (fresh) {
        VIPER_ASSIGN_OR_RETURN(conn_, RedisConnection::Connect(endpoint_, options_));
      }
      Result<T> out = fn(*conn_);
      if (out.ok() || out.status().code() != StatusCode::kUnavailable) return out;
      conn_.reset();
      if (fresh || attempt > 0) return out;
    }
  }
  // The replies of `commands`, or the first error reply as a status.
  static Result<std::vector<Reply>> RunChecked(RedisConnection& c, const std::vector<Command>& commands,
                                               std::string_view doing) {
    VIPER_ASSIGN_OR_RETURN(auto replies, c.Pipeline(commands));
    for (size_t i = 0; i < replies.size(); ++i)
      VIPER_RETURN_IF_ERROR(ExpectOk(replies[i], fmt::format("{}: {} {}", c.where(), doing, commands[i][0])));
    return replies;
  }
  Status RunAll(const std::vector<Command>& commands, std::string_view doing) {
    return WithConnection<std::vector<Reply>>([&](RedisConnection& c) { return RunChecked(c, commands, doing); })
        .status();
  }

  std::string url_;
  RedisEndpoint endpoint_;
  RegistryOptions options_;
  std::mutex mu_;  // guards conn_: one command at a time
  std::unique_ptr<RedisConnection> conn_;
};

// A SUBSCRIBE connection and the thread that reads it; reconnects after the server goes away.
class RedisWatch : public RegistryWatch {
 public:
  RedisWatch(RedisEndpoint endpoint, RegistryOptions options, std::string model, WatchHandlers handlers)
      : endpoint_(std::move(endpoint)), options_(options), model_(std::move(model)), handlers_(std::move(handlers)),
        channel_(AnnounceChannel(endpoint_.db, model_)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  ~RedisWatch() override {
    stop_ = true;
    uint64_t one = 1;
    if (::write(wake_, &one, sizeof one) < 0) {}  // the loop also checks stop_ every retry interval
    if (thread_.joinable()) thread_.join();
    ::close(wake_);
  }

  // Subscribes on this thread, so that announcements after Start returns are not missed.
  Status Start() {
    if (wake_ < 0) return Status::FromErrno("eventfd for the registry watch");
    VIPER_RETURN_IF_ERROR(Subscribe());
    thread_ = std::thread([this] { Run(); });
    return Status::OK();
  }

 private:
  Status Subscribe() {
    VIPER_ASSIGN_OR_RETURN(auto conn, RedisConnection::Connect(endpoint_, options_));
    VIPER_ASSIGN_OR_RETURN(Reply confirm, conn->Run({"SUBSCRIBE", channel_}));
    VIPER_RETURN_IF_ERROR(ExpectArray(confirm.get(), "SUBSCRIBE reply", 3));
    conn_ = std::move(conn);
    return Status::OK();
  }

  void Run() {
    bool gap = false;  // the connection was lost since the last subscribe
    while (!stop_) {
      if (!conn_) {
        if (Status st = Subscribe(); !st.ok()) {
          WaitRetry();
          continue;
        }
        if (gap && handlers_.on_resync) handlers_.on_resync();
        gap = false;
      }
      auto replies = conn_->ReadAvailable(wake_, -1);
      if (!replies.ok()) {
        conn_.reset();
        gap = true;
        if (!stop_ && handlers_.on_error) handlers_.on_error(replies.status().WithContext("registry watch of " + model_));
        continue;
      }
      for (const auto& r : *replies) Deliver(r.get());
    }
  }

  // ["message", channel, payload]; subscribe confirmations and anything else are ignored.
  void Deliver(const redisReply* r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3) return;
    auto kind = ExpectString(r->element[0], "pub/sub reply");
    if (!kind.ok() || *kind != "message") return;
    auto payload = ExpectString(r->element[2], "announcement on " + channel_);
    Result<HolderRecord> record = payload.ok() ? ParseHolderRecord(*payload) : Result<HolderRecord>(payload.status());
    if (record.ok() && record->info.model != model_)
      record = Status::Corruption("registry record: announces " + internal::Quote(record->info.model) + " on the channel of " + model_);
    if (!record.ok()) {
      if (handlers_.on_error) handlers_.on_error(record.status().WithContext("announcement on " + channel_));
      return;
    }
    if (handlers_.on_announce) handlers_.on_announce(*record);
  }

  void WaitRetry() {
    pollfd fd{wake_, POLLIN, 0};
    (void)::poll(&fd, 1, static_cast<int>(options_.retry_interval.count()));
  }

  RedisEndpoint endpoint_;
  RegistryOptions options_;
  std::string model_;
  WatchHandlers handlers_;
  std::string channel_;
  int wake_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<RedisConnection> conn_;  // the watch thread's, after Start
  std::thread thread_;
};

Result<std::unique_ptr<RegistryWatch>> RedisRegistry::Watch(const std::string& model, WatchHandlers handlers) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  auto watch = std::make_unique<RedisWatch>(endpoint_, options_, model, std::move(handlers));
  VIPER_RETURN_IF_ERROR(watch->Start());
  return std::unique_ptr<RegistryWatch>(std::move(watch));
}

}  // namespace

Result<std::unique_ptr<Registry>> MakeRedisRegistry(const std::string& url, const RedisEndpoint& endpoint,
                                                    const RegistryOptions& options) {
  return std::unique_ptr<Registry>(new RedisRegistry(url, endpoint, options));
}

}  // namespace viper::registry_internal
