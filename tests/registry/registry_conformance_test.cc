// One conformance suite for every registry backend, as for every interface: the embedded one and
// Redis (a real redis-server on a free loopback port). Backend-specific behaviour is asked of
// capabilities(), never assumed.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <mutex>

#include "redis_server.h"
#include "registry_test_util.h"
#include "viper/registry.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::MakeRecord;
using testing::WaitUntil;

testing::RedisServer* g_redis = nullptr;

class RedisEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_redis = new testing::RedisServer;
    std::string why = g_redis->Start();
    ASSERT_TRUE(why.empty()) << why;
  }
  void TearDown() override {
    delete g_redis;
    g_redis = nullptr;
  }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new RedisEnvironment);

// Watch events, collected.
struct Heard {
  std::mutex mu;
  std::vector<HolderRecord> records;
  int resyncs = 0;
  std::vector<std::string> errors;
  WatchHandlers Handlers() {
    return {[this](const HolderRecord& r) { std::lock_guard<std::mutex> l(mu); records.push_back(r); },
            [this] { std::lock_guard<std::mutex> l(mu); ++resyncs; },
            [this](const Status& s) { std::lock_guard<std::mutex> l(mu); errors.push_back(s.message()); }};
  }
  size_t count() { std::lock_guard<std::mutex> l(mu); return records.size(); }
};

class RegistryConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis") {
      ASSERT_TRUE(g_redis && g_redis->running()) << (g_redis ? g_redis->log() : "no server");
      auto c = g_redis->Connect();
      ASSERT_TRUE(c);
      ASSERT_TRUE(c->Run({"FLUSHALL"}).ok());
    }
    auto opened = OpenRegistry(Url());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    registry = std::move(opened).value();
    // The embedded catalog lives as long as the process: each test uses its own model names.
    model = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).substr(0, 40);
    for (char& c : model) if (c == '/') c = '-';
  }
  std::string Url() const { return GetParam() == "redis" ? g_redis->url() : "embedded"; }
  std::unique_ptr<Registry> registry;
  std::string model;
};

TEST_P(RegistryConformance, ReportsWhatItCanDo) {
  auto caps = registry->capabilities();
  EXPECT_EQ(registry->backend(), GetParam());
  EXPECT_EQ(registry->url(), Url());
  EXPECT_EQ(caps.shared, GetParam() == "redis");
  EXPECT_TRUE(caps.expiry);
  EXPECT_TRUE(caps.watch);
}

TEST_P(RegistryConformance, LookupListsHoldingsNewestFirst) {
  std::vector<HolderRecord> records = {MakeRecord(model, 1, 1), MakeRecord(model, 3, 1), MakeRecord(model, 2, 2),
                                       MakeRecord(model, 3, 2), MakeRecord(model + "x", 9, 1)};
  ASSERT_TRUE(registry->Put(records, 30s).ok());
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_TRUE(found->rejected.empty());
  ASSERT_EQ(found->holders.size(), 4u);
  std::vector<uint64_t> versions;
  for (const auto& h : found->holders) versions.push_back(h.info.version);
  EXPECT_EQ(versions, (std::vector<uint64_t>{3, 3, 2, 1}));
  for (const auto& h : found->holders) {
    auto same = std::find(records.begin(), records.end(), h);
    EXPECT_NE(same, records.end()) << "a holding came back changed: " << EncodeHolderRecord(h);
  }
  auto none = registry->Lookup(model + "-none");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->holders.empty());
}

TEST_P(RegistryConformance, PutReplacesAndRemoveRemoves) {
  HolderRecord r = MakeRecord(model, 5, 1);
  auto fresh = registry->Put(std::span(&r, 1), 30s);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(*fresh, 1u) << "a new holding";
  r.info.replicas.pop_back();  // e.g. the file left retention
  fresh = registry->Put(std::span(&r, 1), 30s);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, 0u) << "a replaced holding";
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->holders.size(), 1u);
  EXPECT_EQ(found->holders[0], r);
  ASSERT_TRUE(registry->Remove(r.node.id, model, 5).ok());
  ASSERT_TRUE(registry->Remove(r.node.id, model, 5).ok()) << "removing what is not there is fine";
  found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->holders.empty());
}

TEST_P(RegistryConformance, RecordsExpireWithoutHeartbeat) {
  ASSERT_TRUE(registry->capabilities().expiry);
  HolderRecord dying = MakeRecord(model, 1, 1), living = MakeRecord(model, 1, 2);
  ASSERT_TRUE(registry->Put(std::span(&dying, 1), 300ms).ok());
  ASSERT_TRUE(registry->Put(std::span(&living, 1), 60s).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto found = registry->Lookup(model);
        return found.ok() && found->holders.size() == 1 && found->holders[0].node == living.node;
      },
      10s));
  auto models = registry->Models();
  ASSERT_TRUE(models.ok());
  EXPECT_NE(std::find(models->begin(), models->end(), model), models->end());
  auto fresh = registry->Put(std::span(&dying, 1), 60s);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, 1u) << "an expired holding put again counts as new: the registry had lost it";
}

// The heartbeat refreshes the node, not each record: every record of a node lives while Refresh
// is called within the TTL, and goes when it is not. The TTL leaves a loaded machine (TSan, CI)
// 900 ms of slack between refreshes.
TEST_P(RegistryConformance, RefreshKeepsEveryRecordOfTheNodeAlive) {
  constexpr auto kTtl = 1000ms;
  std::vector<HolderRecord> records = {MakeRecord(model, 1, 1), MakeRecord(model, 2, 1), MakeRecord(model, 3, 1)};
  ASSERT_TRUE(registry->Put(records, kTtl).ok());
  auto refreshed = registry->Refresh(records[0].node, kTtl);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status().ToString();
  EXPECT_TRUE(*refreshed);
  auto until = std::chrono::steady_clock::now() + 2 * kTtl;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(100ms);
    refreshed = registry->Refresh(records[0].node, kTtl);
    ASSERT_TRUE(refreshed.ok());
    ASSERT_TRUE(*refreshed) << "refreshed within its TTL, the node was lost";
  }
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->holders.size(), 3u);
  ASSERT_TRUE(WaitUntil([&] { auto f = registry->Lookup(model); return f.ok() && f->holders.empty(); }, 10s))
      << "records outlived their node's TTL";
  refreshed = registry->Refresh(records[0].node, kTtl);
  ASSERT_TRUE(refreshed.ok());
  EXPECT_FALSE(*refreshed) << "a node whose TTL passed must put its records again";
  auto fresh = registry->Put(records, 30s);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, 3u) << "every record of a lost node counts as new";
  refreshed = registry->Refresh(MakeRecord(model, 1, 9).node, 30s);
  ASSERT_TRUE(refreshed.ok());
  EXPECT_FALSE(*refreshed) << "a node that never registered";
  EXPECT_FALSE(registry->Refresh(records[0].node, 0ms).ok()) << "a TTL of 0";
}

// What a new consumer reads: the holders of the newest version that has a live one.
TEST_P(RegistryConformance, LookupLatestListsTheNewestLiveVersionsHolders) {
  std::vector<HolderRecord> records;
  for (int n = 1; n <= 300; ++n) records.push_back(MakeRecord(model, 2, n));  // more than one page
  records.push_back(MakeRecord(model, 1, 1));
  ASSERT_TRUE(registry->Put(records, 30s).ok());
  HolderRecord dying = MakeRecord(model, 3, 400);
  ASSERT_TRUE(registry->Put(std::span(&dying, 1), 1s).ok());  // lives through the next lookup, even under load
  auto latest = registry->LookupLatest(model);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  ASSERT_EQ(latest->holders.size(), 1u);
  EXPECT_EQ(latest->holders[0], dying);
  ASSERT_TRUE(WaitUntil([&] { auto l = registry->LookupLatest(model); return l.ok() && l->holders.size() == 300; }, 10s))
      << "a version whose only holder died hides the live ones";
  latest = registry->LookupLatest(model);
  for (const auto& h : latest->holders) EXPECT_EQ(h.info.version, 2u);
  latest = registry->LookupLatest(model + "-none");
  ASSERT_TRUE(latest.ok());
  EXPECT_TRUE(latest->holders.empty());
}

TEST_P(RegistryConformance, ModelsListsLiveModelsSorted) {
  std::vector<HolderRecord> records = {MakeRecord(model + "-b", 1, 1), MakeRecord(model + "-a", 2, 1)};
  ASSERT_TRUE(registry->Put(records, 30s).ok());
  auto models = registry->Models();
  ASSERT_TRUE(models.ok()) << models.status().ToString();
  EXPECT_TRUE(std::is_sorted(models->begin(), models->end()));
  auto a = std::find(models->begin(), models->end(), model + "-a");
  auto b = std::find(models->begin(), models->end(), model + "-b");
  EXPECT_NE(a, models->end());
  EXPECT_NE(b, models->end());
}

TEST_P(RegistryConformance, WatchHearsAnnouncementsOfItsModelOnly) {
  Heard heard, other;
  auto watch = registry->Watch(model, heard.Handlers());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  auto other_watch = registry->Watch(model + "-other", other.Handlers());
  ASSERT_TRUE(other_watch.ok());
  HolderRecord r = MakeRecord(model, 7, 3);
  ASSERT_TRUE(registry->Put(std::span(&r, 1), 30s).ok());
  ASSERT_TRUE(registry->Announce(r).ok());
  ASSERT_TRUE(WaitUntil([&] { return heard.count() == 1; }, 10s));
  EXPECT_EQ(heard.records[0], r);
  watch->reset();  // no announcement is delivered after the watch is gone
  ASSERT_TRUE(registry->Announce(MakeRecord(model, 8, 3)).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(heard.count(), 1u);
  EXPECT_EQ(other.count(), 0u);
  EXPECT_TRUE(heard.errors.empty());
}

TEST_P(RegistryConformance, PutRefusesWhatReadersWouldReject) {
  HolderRecord r = MakeRecord(model, 1, 1);
  r.node.address = "127.0.0.1:0";
  Status st = registry->Put(std::span(&r, 1), 30s).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("port 0"), std::string::npos) << st.message();
  r = MakeRecord(model, 1, 1);
  r.info.model = "bad/name";
  st = registry->Put(std::span(&r, 1), 30s).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("model"), std::string::npos) << st.message();
}

TEST_P(RegistryConformance, NearestHolderIsOnThisHostFirst) {
  std::vector<HolderRecord> records = {MakeRecord(model, 4, 1, "far"), MakeRecord(model, 4, 2, "here"),
                                       MakeRecord(model, 3, 3, "here")};
  ASSERT_TRUE(registry->Put(records, 30s).ok());
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  auto nearest = NearestHoldersOfLatest(*found, "here");
  ASSERT_EQ(nearest.size(), 2u) << "only holders of the latest version";
  EXPECT_EQ(nearest[0].node.host_key, "here");
  EXPECT_EQ(nearest[1].node.host_key, "far");
}

INSTANTIATE_TEST_SUITE_P(Backends, RegistryConformance, ::testing::Values("embedded", "redis"),
                         [](const auto& info) { return info.param; });

// ------------------------------------------------------------------ shared backends only

class SharedRegistry : public RegistryConformance {};

TEST_P(SharedRegistry, AnotherConnectionSeesTheRecords) {
  ASSERT_TRUE(registry->capabilities().shared);
  auto second = OpenRegistry(Url());
  ASSERT_TRUE(second.ok());
  HolderRecord r = MakeRecord(model, 2, 1);
  ASSERT_TRUE(registry->Put(std::span(&r, 1), 30s).ok());
  auto found = (*second)->Lookup(model);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->holders.size(), 1u);
  EXPECT_EQ(found->holders[0], r);
}

// Redis layout: one key per node carries the TTL; records and indexes carry none, so the heartbeat
// is one command whatever the number of versions held.
TEST_P(SharedRegistry, OnlyTheNodeKeyExpires) {
  std::vector<HolderRecord> records;
  for (uint64_t v = 1; v <= 50; ++v) records.push_back(MakeRecord(model, v, 1));
  ASSERT_TRUE(registry->Put(records, 30s).ok());
  auto raw = g_redis->Connect();
  ASSERT_TRUE(raw);
  auto ttl = raw->Run({"PTTL", "viper:node:" + records[0].node.id});
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT((*ttl)->integer, 0);
  ttl = raw->Run({"PTTL", "viper:rec:" + model + ":7:" + records[0].node.id});
  ASSERT_TRUE(ttl.ok());
  EXPECT_EQ((*ttl)->integer, -1) << "a record with a TTL of its own";
  ttl = raw->Run({"PTTL", "viper:idx:" + model});
  ASSERT_TRUE(ttl.ok());
  EXPECT_EQ((*ttl)->integer, -1) << "an index with a TTL of its own";
  ASSERT_TRUE(raw->Run({"CONFIG", "RESETSTAT"}).ok());
  ASSERT_TRUE(registry->Refresh(records[0].node, 30s).ok());
  auto stats = raw->Run({"INFO", "commandstats"});
  ASSERT_TRUE(stats.ok());
  std::string text((*stats)->str, (*stats)->len);
  EXPECT_NE(text.find("cmdstat_set:calls=1,"), std::string::npos) << text;
  EXPECT_EQ(text.find("cmdstat_pexpire"), std::string::npos) << text;
}

// A node restarted on the same address has the same id but another pid: the records of the
// previous process that the new one did not put again are not served, and the lookup removes them.
TEST_P(SharedRegistry, RecordsOfAPreviousProcessAreNotServed) {
  HolderRecord old_process = MakeRecord(model, 1, 1), new_process = MakeRecord(model, 2, 1);
  new_process.node.pid = old_process.node.pid + 1;
  ASSERT_TRUE(registry->Put(std::span(&old_process, 1), 30s).ok());
  ASSERT_TRUE(registry->Put(std::span(&new_process, 1), 30s).ok());
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->holders.size(), 1u);
  EXPECT_EQ(found->holders[0], new_process);
  auto raw = g_redis->Connect();
  ASSERT_TRUE(raw);
  auto left = raw->Run({"EXISTS", "viper:rec:" + model + ":1:" + old_process.node.id});
  ASSERT_TRUE(left.ok());
  EXPECT_EQ((*left)->integer, 0) << "the lookup left the old process's record behind";
  auto members = raw->Run({"ZCARD", "viper:idx:" + model});
  ASSERT_TRUE(members.ok());
  EXPECT_EQ((*members)->integer, 1);
}

// Whoever can write to Redis can write anything: each malformed record is skipped and named,
// the good ones are still served.
TEST_P(SharedRegistry, MalformedRecordsAreRejectedWithAClearError) {
  HolderRecord good = MakeRecord(model, 2, 1);
  ASSERT_TRUE(registry->Put(std::span(&good, 1), 30s).ok());
  auto raw = g_redis->Connect();
  ASSERT_TRUE(raw);
  std::string id = std::string(16, 'a');
  struct Bad {
    uint64_t version;
    std::string value;
    std::string expect;
  };
  HolderRecord elsewhere = MakeRecord(model, 3, 2);
  std::string moved = EncodeHolderRecord(MakeRecord(model, 99, 2));
  std::string wrong_port = EncodeHolderRecord(elsewhere);
  wrong_port.replace(wrong_port.find("127.0.0.1:7002"), 14, "127.0.0.1:99999");
  std::vector<Bad> bad = {
      {3, "{not json", "not valid JSON"},
      {4, moved, "stored under another key"},
      {5, wrong_port, "larger than 65535"},
      {6, std::string(kMaxRecordBytes + 1, ' '), "bytes (at most"},
      {7, R"({"format":2})", "format 2 is not supported"},
  };
  for (const auto& b : bad) {
    std::string key = "viper:rec:" + model + ":" + std::to_string(b.version) + ":" + id;
    ASSERT_TRUE(raw->Run({"SET", key, b.value}).ok());
    ASSERT_TRUE(raw->Run({"ZADD", "viper:idx:" + model, std::to_string(b.version), std::to_string(b.version) + ":" + id}).ok());
  }
  ASSERT_TRUE(raw->Run({"ZADD", "viper:idx:" + model, "8", "8:not-a-node-id"}).ok());
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->holders.size(), 1u);
  EXPECT_EQ(found->holders[0], good);
  ASSERT_EQ(found->rejected.size(), bad.size() + 1);
  std::string all;
  for (const auto& r : found->rejected) all += r + "\n";
  for (const auto& b : bad) EXPECT_NE(all.find(b.expect), std::string::npos) << "no '" << b.expect << "' in\n" << all;
  EXPECT_NE(all.find("is not <version>:<node id>"), std::string::npos) << all;
  // An announcement that does not parse is reported, not delivered.
  Heard heard;
  auto watch = registry->Watch(model, heard.Handlers());
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(raw->Run({"PUBLISH", "viper:0:announce:" + model, R"({"format":1,"node":7})"}).ok());
  ASSERT_TRUE(raw->Run({"PUBLISH", "viper:0:announce:" + model, EncodeHolderRecord(MakeRecord(model + "z", 1, 1))}).ok());
  ASSERT_TRUE(WaitUntil([&] { std::lock_guard<std::mutex> l(heard.mu); return heard.errors.size() == 2; }, 10s));
  EXPECT_EQ(heard.count(), 0u);
  EXPECT_NE(heard.errors[0].find("node is number 7, not an object"), std::string::npos) << heard.errors[0];
  EXPECT_NE(heard.errors[1].find("on the channel of"), std::string::npos) << heard.errors[1];
}

// A database number keeps fleets apart on one server, announcements included.
TEST_P(SharedRegistry, DatabasesAreSeparate) {
  auto db1 = OpenRegistry(g_redis->url(1));
  ASSERT_TRUE(db1.ok());
  Heard heard;
  auto watch = registry->Watch(model, heard.Handlers());
  ASSERT_TRUE(watch.ok());
  HolderRecord r = MakeRecord(model, 1, 1);
  ASSERT_TRUE((*db1)->Put(std::span(&r, 1), 30s).ok());
  ASSERT_TRUE((*db1)->Announce(r).ok());
  auto found = registry->Lookup(model);
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->holders.empty());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(heard.count(), 0u);
}

// A Redis server that dies while a node writes to it fails that call; it does not end the
// process. hiredis writes with write(2), which raises SIGPIPE on a connection the server reset,
// and SIGPIPE's default action kills silently: the fault suite's producer died that way when
// Redis was killed while the node re-registered its ~1,000 records.
TEST(RedisConnection, ServerKilledMidWriteIsAnErrorNotSigpipe) {
  testing::RedisServer server;
  ASSERT_EQ(server.Start(), "");
  auto conn = server.Connect();
  ASSERT_TRUE(conn);
  ASSERT_TRUE(conn->Run({"PING"}).ok());
  server.Kill();
  // 20 MB of commands, more than the socket buffers take: the writes go on after the reset.
  std::vector<registry_internal::Command> commands(20000, {"SET", "k", std::string(1024, 'x')});
  auto written = conn->Pipeline(commands);
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), StatusCode::kUnavailable) << written.status().ToString();
  EXPECT_NE(written.status().message().find("redis 127.0.0.1:" + std::to_string(server.port())), std::string::npos)
      << written.status().ToString();
  sigset_t pending;
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE)) << "a SIGPIPE of the failed write was left pending";
  EXPECT_FALSE(conn->Run({"PING"}).ok());  // broken for good: no write is tried again
}

INSTANTIATE_TEST_SUITE_P(Backends, SharedRegistry, ::testing::Values("redis"), [](const auto& info) { return info.param; });

}  // namespace
}  // namespace viper
