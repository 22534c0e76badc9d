// Nodes, subscribers and a real redis-server together (issue 15 item 1): discovery, notification
// through Redis beside the node's own push, node restart, TTL expiry of a dead node, Redis killed
// and restarted, Redis down while the node keeps serving, malformed records. Each test starts its
// own redis-server on a free loopback port and stops it at the end.
#include <gtest/gtest.h>

#include <set>

#include "fleet.h"
#include "viper/node.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::CountLines;
using testing::PublishTo;
using testing::ServeProcess;
using testing::TempDir;
using testing::WaitUntil;

class Fleet : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = redis.Start();
    ASSERT_TRUE(why.empty()) << why;
    auto opened = OpenRegistry(redis.url());
    ASSERT_TRUE(opened.ok());
    registry = std::move(opened).value();
  }

  std::unique_ptr<Node> StartNode(const std::string& name) {
    NodeOptions options;
    options.name = name;
    options.registry = redis.url();
    options.registry_heartbeat = {1500ms, 300ms};
    auto node = Node::Start(options);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    return node.ok() ? std::move(node).value() : nullptr;
  }

  std::unique_ptr<Subscriber> Subscribe(const std::string& model, std::vector<uint64_t>* live = nullptr,
                                        std::mutex* mu = nullptr) {
    SubscriberOptions options;
    options.model = model;
    options.registry = redis.url();
    options.request_timeout = 10s;
    auto sub = Subscriber::Start(options);
    EXPECT_TRUE(sub.ok()) << sub.status().ToString();
    if (!sub.ok()) return nullptr;
    if (live)
      (*sub)->OnUpdate([live, mu](const std::shared_ptr<const ModelVersion>& mv) {
        std::lock_guard<std::mutex> lock(*mu);
        live->push_back(mv->version());
      });
    return std::move(sub).value();
  }

  std::set<uint64_t> Registered(const std::string& model, const std::string& address) {
    return testing::RegisteredFor(*registry, model, address);
  }

  std::set<uint64_t> RegisteredWithFile(const std::string& model, const std::string& address) {
    std::set<uint64_t> out;
    auto found = registry->Lookup(model);
    if (!found.ok()) return out;
    for (const auto& h : found->holders)
      for (const auto& r : h.info.replicas)
        if (h.node.address == address && r.kind == proto::ReplicaKind::kFile) out.insert(h.info.version);
    return out;
  }

  std::set<uint64_t> Held(const std::string& model, const std::string& address) {
    auto c = testing::ConnectTo(address);
    return c ? testing::HeldBy(*c, model) : std::set<uint64_t>{};
  }

  testing::RedisServer redis;
  std::unique_ptr<Registry> registry;
  TempDir dir;
};

// A subscriber given only the model and the Redis URL, started before any node holds the model,
// hears of the first version through Redis alone, connects to the node that holds it (this host:
// it maps the segment), and then hears of each version twice (the node's push and Redis) but
// loads it once.
TEST_F(Fleet, DiscoversTheHolderAndLoadsEachVersionOnce) {
  std::vector<uint64_t> live;
  std::mutex mu;
  auto sub = Subscribe("disc", &live, &mu);
  ASSERT_TRUE(sub);
  auto node = StartNode("disc-node");
  ASSERT_TRUE(node);
  const std::string address = node->address();
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    uint64_t v = PublishTo(address, "disc", seed);
    ASSERT_EQ(v, seed);
    auto got = sub->WaitFor(v, 20s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ((*got)->path, FetchPath::kMap) << (*got)->reason;
  }
  ASSERT_TRUE(WaitUntil([&] { return sub->stats().notifies >= 8; }, 10s)) << "heard " << sub->stats().notifies;
  std::this_thread::sleep_for(300ms);  // a late duplicate would load now
  SubscriberStats stats = sub->stats();
  EXPECT_EQ(stats.updates, 4u);
  EXPECT_EQ(stats.fetch_failures, 0u);
  EXPECT_EQ(node->stats().leases_granted, 4u) << "each version fetched once";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(live, (std::vector<uint64_t>{1, 2, 3, 4}));
}

// The nearest holder: with the model on two nodes the subscriber connects to one on this host;
// `viper ls --registry` lists both holders, `viper pull --registry` fetches the newest version.
TEST_F(Fleet, ListsAndPullsThroughTheRegistry) {
  ServeProcess a(dir, "ls-a", redis.url(), 5);
  ASSERT_FALSE(a.address().empty()) << a.log();
  ASSERT_EQ(PublishTo(a.address(), "lsm", 1), 1u);
  ASSERT_EQ(PublishTo(a.address(), "lsm", 2), 2u);
  ASSERT_TRUE(WaitUntil([&] { return Registered("lsm", a.address()).size() == 2; }, 10s));
  testing::Process ls({testing::ViperBinary(), "ls", "--registry", redis.url(), "--json"}, dir / "ls.log");
  ASSERT_EQ(ls.Wait(30s), 0) << ls.log();
  EXPECT_NE(ls.log().find("\"node\": \"" + a.address() + "\""), std::string::npos) << ls.log();
  testing::Process pull({testing::ViperBinary(), "pull", "lsm", "--registry", redis.url(), "-o", (dir / "out").string()},
                        dir / "pull.log");
  ASSERT_EQ(pull.Wait(30s), 0) << pull.log();
  EXPECT_NE(pull.log().find("pulled lsm version 2"), std::string::npos) << pull.log();
  auto pulled = Snapshot::OpenFile(dir / "out");
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
}

// A node killed with -9 and restarted on the same address and store registers what it recovered
// under the same node id (replacing its old records); a subscriber started afterwards finds it.
TEST_F(Fleet, RestartedNodeRegistersWhatItRecovered) {
  ServeProcess node(dir, "rs", redis.url(), 3);
  ASSERT_FALSE(node.address().empty()) << node.log();
  for (uint64_t seed = 1; seed <= 3; ++seed) ASSERT_EQ(PublishTo(node.address(), "rsm", seed), seed);
  ASSERT_TRUE(WaitUntil([&] { return Registered("rsm", node.address()) == std::set<uint64_t>{1, 2, 3}; }, 10s));
  // A version is durable once its file is written (the record then lists it): kill -9 before
  // that loses the version with the node's memory.
  ASSERT_TRUE(WaitUntil([&] { return RegisteredWithFile("rsm", node.address()) == std::set<uint64_t>{1, 2, 3}; }, 10s));
  pid_t old_pid = node.process().pid();
  node.Restart();
  ASSERT_FALSE(node.address().empty()) << node.log();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto found = registry->Lookup("rsm");
        if (!found.ok() || found->holders.empty()) return false;
        for (const auto& h : found->holders)
          if (h.node.pid == static_cast<uint32_t>(old_pid)) return false;
        return true;
      },
      10s))
      << node.log();
  EXPECT_EQ(Registered("rsm", node.address()), Held("rsm", node.address()));
  auto sub = Subscribe("rsm");
  ASSERT_TRUE(sub);
  auto got = sub->WaitFor(3, 20s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(PublishTo(node.address(), "rsm", 4), 4u) << "numbering goes on after the recovered versions";
  ASSERT_TRUE(sub->WaitFor(4, 20s).ok());
}

// A node that dies without a word disappears from the registry once its TTL passes.
TEST_F(Fleet, DeadNodesRecordsExpire) {
  ServeProcess node(dir, "ttl", redis.url(), 1);
  ASSERT_FALSE(node.address().empty()) << node.log();
  ASSERT_EQ(PublishTo(node.address(), "ttlm", 1), 1u);
  ASSERT_TRUE(WaitUntil([&] { return !Registered("ttlm", node.address()).empty(); }, 10s));
  // The records live as long as the node's key: what is left of its TTL bounds their end from below
  // (a heartbeat late under load leaves less of it than TTL * 2/3).
  auto raw = redis.Connect();
  ASSERT_TRUE(raw);
  auto keys = raw->Run({"KEYS", "viper:node:*"});
  ASSERT_TRUE(keys.ok() && (*keys)->type == REDIS_REPLY_ARRAY && (*keys)->elements == 1) << "one node, one key";
  const std::string node_key((*keys)->element[0]->str, (*keys)->element[0]->len);
  auto measured = std::chrono::steady_clock::now();
  auto left = raw->Run({"PTTL", node_key});
  ASSERT_TRUE(left.ok() && (*left)->integer > 0) << node_key << " has no TTL";
  node.Kill();
  ASSERT_TRUE(WaitUntil([&] { return Registered("ttlm", node.address()).empty(); }, 10s));
  EXPECT_GE(std::chrono::steady_clock::now() - measured, std::chrono::milliseconds((*left)->integer) - 5ms)
      << "expired before its TTL could have run out";
  ASSERT_TRUE(WaitUntil([&] { auto r = raw->Run({"EXISTS", "viper:idx:ttlm"}); return r.ok() && (*r)->integer == 0; }, 10s))
      << "the index outlives its holders";
  auto models = registry->Models();
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(std::count(models->begin(), models->end(), "ttlm"), 0);
}

// Redis killed with -9 while versions are published and restarted with nothing in it: the node
// registers everything again, re-announces the newest, and the subscriber (which heard nothing
// from Redis meanwhile) reaches the last version through the node's push; no version loads twice.
TEST_F(Fleet, RedisKilledMidRunLosesNothing) {
  ServeProcess node(dir, "kill", redis.url(), 2);
  ASSERT_FALSE(node.address().empty()) << node.log();
  std::vector<uint64_t> live;
  std::mutex mu;
  ASSERT_EQ(PublishTo(node.address(), "km", 1), 1u);
  auto sub = Subscribe("km", &live, &mu);
  ASSERT_TRUE(sub);
  ASSERT_TRUE(sub->WaitFor(1, 20s).ok());
  uint64_t last = 1;
  for (uint64_t seed = 2; seed <= 4; ++seed) last = PublishTo(node.address(), "km", seed);
  redis.Kill();
  for (uint64_t seed = 5; seed <= 8; ++seed) last = PublishTo(node.address(), "km", seed);  // announced while down
  ASSERT_TRUE(sub->WaitFor(last, 20s).ok()) << "the node's push goes on without Redis";
  ASSERT_TRUE(redis.Restart().empty());
  ASSERT_TRUE(WaitUntil([&] { return Registered("km", node.address()) == Held("km", node.address()); }, 15s))
      << node.log();
  EXPECT_EQ(*Registered("km", node.address()).rbegin(), last);
  last = PublishTo(node.address(), "km", 9);
  ASSERT_TRUE(sub->WaitFor(last, 20s).ok());
  std::this_thread::sleep_for(300ms);
  // The node logs that Redis is back after it registered again: wait for the line (see below).
  EXPECT_TRUE(WaitUntil([&] { return CountLines(node.log(), "is reachable again") >= 1; }, 10s)) << node.log();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(std::is_sorted(live.begin(), live.end()) && std::adjacent_find(live.begin(), live.end()) == live.end())
      << "a version was loaded twice or out of order";
  EXPECT_EQ(live.back(), last);
  std::string log = node.log();
  EXPECT_EQ(CountLines(log, "is unreachable"), 1) << log;
  EXPECT_EQ(CountLines(log, "is reachable again"), 1) << log;
}

// Redis down for several heartbeats: the node keeps serving (a watcher connected by address and one
// that found it through the registry both get every version), warns once, and registers again
// when Redis is back.
TEST_F(Fleet, RedisDownNodeKeepsServing) {
  ServeProcess node(dir, "down", redis.url(), 0.6);
  ASSERT_FALSE(node.address().empty()) << node.log();
  ASSERT_EQ(PublishTo(node.address(), "dm", 1), 1u);
  testing::Process by_registry({testing::ViperBinary(), "watch", "dm", "--registry", redis.url(), "--json", "--count",
                                "5", "--timeout", "60"},
                               dir / "by_registry.log");
  testing::Process by_address({testing::ViperBinary(), "watch", "dm", "--connect", node.address(), "--json", "--count",
                               "5", "--timeout", "60"},
                              dir / "by_address.log");
  ASSERT_TRUE(WaitUntil([&] { return CountLines(by_registry.log(), "\"version\":1") == 1; }, 20s)) << by_registry.log();
  ASSERT_TRUE(WaitUntil([&] { return CountLines(by_address.log(), "\"version\":1") == 1; }, 20s)) << by_address.log();
  redis.Kill();
  for (uint64_t seed = 2; seed <= 5; ++seed) {
    ASSERT_EQ(PublishTo(node.address(), "dm", seed), seed);
    // Both watchers have it before the next comes (a watcher busy when a newer version is
    // announced skips to the newest, and would never count five).
    const std::string line = "\"version\":" + std::to_string(seed);
    for (auto* watcher : {&by_registry, &by_address})
      ASSERT_TRUE(WaitUntil([&] { return CountLines(watcher->log(), line) == 1; }, 20s)) << watcher->log();
    std::this_thread::sleep_for(400ms);  // at least 1.6 s of outage: eight heartbeats
  }
  ASSERT_EQ(by_registry.Wait(30s), 0) << by_registry.log();
  ASSERT_EQ(by_address.Wait(30s), 0) << by_address.log();
  EXPECT_EQ(CountLines(by_registry.log(), "\"version\":"), 5) << by_registry.log();
  EXPECT_EQ(CountLines(by_registry.log(), "registry watch of dm"), 1) << "one warning, not one per retry\n"
                                                                       << by_registry.log();
  std::string log = node.log();
  EXPECT_EQ(CountLines(log, "is unreachable"), 1) << log;
  ASSERT_TRUE(redis.Restart().empty());
  ASSERT_TRUE(WaitUntil([&] { return Registered("dm", node.address()) == Held("dm", node.address()); }, 15s)) << node.log();
  // The records are back in Redis before the node logs it (the agent logs after its Sync; an ASan
  // run read the log in between): wait for the line, then check it came once.
  EXPECT_TRUE(WaitUntil([&] { return CountLines(node.log(), "is reachable again") >= 1; }, 10s)) << node.log();
  EXPECT_EQ(CountLines(node.log(), "is reachable again"), 1) << node.log();
}

// Clear errors at the edges: a bad URL, Redis unreachable when a subscriber starts, and malformed
// records that `viper ls --registry` names and skips.
TEST_F(Fleet, ClearErrors) {
  testing::Process bad_url({testing::ViperBinary(), "serve", "--registry", "redis://localhost:99999"}, dir / "bad.log");
  EXPECT_EQ(bad_url.Wait(30s), 2) << bad_url.log();
  EXPECT_NE(bad_url.log().find("port 99999 is larger than 65535"), std::string::npos) << bad_url.log();

  SubscriberOptions so;
  so.model = "m";
  so.registry = "redis://127.0.0.1:" + std::to_string(testing::PickFreePort());
  auto sub = Subscriber::Start(so);
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.status().code(), StatusCode::kUnavailable) << sub.status().ToString();
  EXPECT_NE(sub.status().message().find("cannot connect"), std::string::npos) << sub.status().ToString();

  auto raw = redis.Connect();
  ASSERT_TRUE(raw);
  ASSERT_TRUE(raw->Run({"SET", "viper:rec:evil:1:0123456789abcdef", "{\"format\":1}"}).ok());
  ASSERT_TRUE(raw->Run({"ZADD", "viper:idx:evil", "1", "1:0123456789abcdef"}).ok());
  testing::Process ls({testing::ViperBinary(), "ls", "--registry", redis.url()}, dir / "ls.log");
  EXPECT_EQ(ls.Wait(30s), 0) << ls.log();
  EXPECT_NE(ls.log().find("viper:rec:evil:1:0123456789abcdef: registry record: record.node is missing"), std::string::npos)
      << ls.log();
}

}  // namespace
}  // namespace viper
