// The Redis backend. Layout (docs/ARCHITECTURE.md "Registry"):
//   viper:rec:<model>:<version>:<node id>   STRING, the HolderRecord JSON, PX ttl
//   viper:idx:<model>                       ZSET, member "<version>:<node id>", score version, PX ttl
//   channel viper:<db>:announce:<model>     PUBLISH of the HolderRecord JSON
// A record key that expired leaves its index member behind until a lookup removes it; the index
// itself expires when no node refreshes it.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/snapshot_internal.h"
#include "redis_connection.h"
#include "viper/file_tier.h"

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
  RegistryCapabilities capabilities() const override { return {.shared = true, .expiry = true, .watch = true}; }

  Result<size_t> Put(std::span<const HolderRecord> records, std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) return Status::InvalidArgument("registry TTL must be positive");
    std::vector<Command> commands;
    std::string px = std::to_string(ttl.count());
    for (const auto& r : records) {
      VIPER_RETURN_IF_ERROR(CheckRecord(r));
      const auto& m = r.info.model;
      std::string key = RecordKey(m, r.info.version, r.node.id);
      commands.push_back({"EXISTS", key});
      commands.push_back({"SET", key, EncodeHolderRecord(r), "PX", px});
      commands.push_back({"ZADD", IndexKey(m), std::to_string(r.info.version), IndexMember(r.info.version, r.node.id)});
      commands.push_back({"PEXPIRE", IndexKey(m), px});
    }
    if (commands.empty()) return size_t{0};
    return WithConnection<size_t>([&](RedisConnection& c) -> Result<size_t> {
      VIPER_ASSIGN_OR_RETURN(auto replies, RunChecked(c, commands, "registering"));
      size_t fresh = 0;
      for (size_t i = 0; i < replies.size(); i += 4) fresh += replies[i]->type == REDIS_REPLY_INTEGER && replies[i]->integer == 0;
      return fresh;
    });
  }

  Status Remove(const std::string& node_id, const std::string& model, uint64_t version) override {
    return RunAll({{"DEL", RecordKey(model, version, node_id)}, {"ZREM", IndexKey(model), IndexMember(version, node_id)}},
                  "removing");
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

 private:
  Result<RegistryLookup> LookupOn(RedisConnection& conn, const std::string& model) {
    RedisConnection* c = &conn;
    auto members = c->Run({"ZREVRANGEBYSCORE", IndexKey(model), "+inf", "-inf", "LIMIT", "0",
                           std::to_string(kMaxLookupHoldings)});
    if (!members.ok()) return members.status();
    VIPER_RETURN_IF_ERROR(ExpectArray(members->get(), "index of " + model, kMaxLookupHoldings));
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
    auto values = c->Run(mget);
    if (!values.ok()) return values.status();
    VIPER_RETURN_IF_ERROR(ExpectArray(values->get(), "MGET of " + model + "'s records", holdings.size()));
    if ((*values)->elements != holdings.size()) return Status::Corruption("MGET returned the wrong number of values");
    Command prune = {"ZREM", IndexKey(model)};
    for (size_t i = 0; i < holdings.size(); ++i) {
      const auto& [version, id] = holdings[i];
      const redisReply* v = (*values)->element[i];
      if (v->type == REDIS_REPLY_NIL) {  // expired: its node stopped refreshing it
        prune.push_back(IndexMember(version, id));
        continue;
      }
      auto text = ExpectString(v, mget[i + 1]);
      Result<HolderRecord> record = text.ok() ? ParseHolderRecord(*text) : Result<HolderRecord>(text.status());
      Status st = record.ok() ? MatchesKey(*record, model, version, id) : record.status();
      if (!st.ok()) {
        out.rejected.push_back(mget[i + 1] + ": " + st.message());
        continue;
      }
      out.holders.push_back(std::move(record).value());
    }
    if (prune.size() > 2) {
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
    return models;
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
