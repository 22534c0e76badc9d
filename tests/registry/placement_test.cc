// Placement on a real redis-server (Registry::Join, Stay, Leave): joins are atomic (threads joining
// at once never overfill a parent), the order of choice (prefer, this host, shallowest, least
// loaded), no cycles, re-joining frees the old slot, memberships expire.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <map>
#include <thread>

#include "redis_server.h"
#include "viper/registry.h"

namespace viper::testing {
namespace {

using namespace std::chrono_literals;

NodeRecord Node(int i, const std::string& host = "host-a") {
  return NodeRecordFor("n" + std::to_string(i), "10.0.0." + std::to_string(i % 250 + 1) + ":" + std::to_string(7000 + i),
                       host, 100 + i);
}

class Placement : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = redis_.Start();
    ASSERT_TRUE(why.empty()) << why;
    registry_ = Open();
  }
  std::unique_ptr<Registry> Open() {
    auto r = OpenRegistry(redis_.url());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  JoinRequest Request(const NodeRecord& node, std::vector<NodeRecord> roots, uint32_t children = 2) {
    JoinRequest r;
    r.model = "m";
    r.node = node;
    r.roots = std::move(roots);
    r.max_children = children;
    r.ttl = 10s;
    return r;
  }
  // parent id -> children, as stored (every live member's `p`).
  std::map<std::string, int> Loads() {
    std::map<std::string, int> out;
    auto c = redis_.Connect();
    auto members = c->Run({"ZRANGE", "viper:tree:m", "0", "-1"});
    EXPECT_TRUE(members.ok());
    for (size_t i = 0; i < (*members)->elements; ++i) {
      std::string id((*members)->element[i]->str, (*members)->element[i]->len);
      auto p = c->Run({"HGET", "viper:tree:m:" + id, "p"});
      EXPECT_TRUE(p.ok() && (*p)->type == REDIS_REPLY_STRING) << id;
      if (p.ok() && (*p)->type == REDIS_REPLY_STRING) out[std::string((*p)->str, (*p)->len)]++;
    }
    return out;
  }
  RedisServer redis_;
  std::unique_ptr<Registry> registry_;
};

// Threads on their own connections join at once for one last slot, round after round: exactly one
// takes it. Each joiner avoids the other joiners, so the root's single slot is the only choice.
TEST_F(Placement, ConcurrentJoinsNeverTakeTheLastSlotTwice) {
  constexpr int kJoiners = 12, kRounds = 25;
  std::vector<std::unique_ptr<Registry>> registries;
  for (int i = 0; i < kJoiners; ++i) registries.push_back(Open());
  for (int round = 0; round < kRounds; ++round) {
    NodeRecord root = Node(1000 + round, "root-host");
    std::vector<NodeRecord> joiners;
    for (int i = 0; i < kJoiners; ++i) joiners.push_back(Node(round * kJoiners + i, "host-" + std::to_string(i)));
    std::atomic<int> placed{0}, refused{0};
    std::barrier start(kJoiners);
    std::vector<std::thread> threads;
    for (int i = 0; i < kJoiners; ++i)
      threads.emplace_back([&, i] {
        JoinRequest r = Request(joiners[i], {root});
        for (const auto& other : joiners)
          if (other.id != joiners[i].id) r.avoid.push_back(other.address);
        start.arrive_and_wait();
        auto p = registries[i]->Join(r);
        if (p.ok()) {
          EXPECT_EQ(p->parent, (NodeRecord{root.id, "", root.address, root.host_key, 0}));
          EXPECT_EQ(p->depth, 1u);
          placed++;
        } else {
          EXPECT_EQ(p.status().code(), StatusCode::kNotFound) << p.status().ToString();
          refused++;
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(placed.load(), 1) << "round " << round;
    EXPECT_EQ(refused.load(), kJoiners - 1) << "round " << round;
    EXPECT_EQ(Loads()[root.id], 1) << "round " << round;
    for (const auto& j : joiners) ASSERT_TRUE(registry_->Leave("m", j.id).ok());
  }
}

// Many joiners at once into a tree of members with two slots each: no parent ends up over its
// bound, and every joiner finds a place (the tree grows as they join).
TEST_F(Placement, ConcurrentJoinsRespectEveryBound) {
  constexpr int kJoiners = 40;
  NodeRecord root = Node(999, "root-host");
  std::vector<std::unique_ptr<Registry>> registries;
  for (int i = 0; i < kJoiners; ++i) registries.push_back(Open());
  std::atomic<int> placed{0};
  std::barrier start(kJoiners);
  std::vector<std::thread> threads;
  for (int i = 0; i < kJoiners; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      auto p = registries[i]->Join(Request(Node(i, "host-" + std::to_string(i)), {root}, 2));
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      placed += p.ok();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(placed.load(), kJoiners);
  auto loads = Loads();
  int total = 0;
  for (const auto& [parent, n] : loads) {
    EXPECT_LE(n, parent == root.id ? 1 : 2) << parent;
    total += n;
  }
  EXPECT_EQ(total, kJoiners);
  EXPECT_EQ(loads[root.id], 1);  // the producer's egress stays one copy
}

TEST_F(Placement, ChoosesThisHostThenTheShallowestLeastLoaded) {
  NodeRecord root = Node(0, "h0");
  auto a = registry_->Join(Request(Node(1, "h1"), {root}));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->parent.id, root.id);
  EXPECT_EQ(a->depth, 1u);
  // The root is full (one child): the next goes under node 1, at depth 2.
  auto b = registry_->Join(Request(Node(2, "h2"), {root}));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->parent.id, Node(1, "h1").id);
  EXPECT_EQ(b->depth, 2u);
  // Node 1 still has a slot at depth 1: shallower than node 2's, so it wins (not a chain).
  auto c = registry_->Join(Request(Node(3, "h3"), {root}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->parent.id, Node(1, "h1").id);
  EXPECT_EQ(c->siblings, 1u);
  // Node 1 full: nodes 2 and 3 at depth 2 with no children; a node on host h3 goes under node 3.
  auto d = registry_->Join(Request(Node(4, "h3"), {root}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->parent.id, Node(3, "h3").id);
  // Another host: node 2 (0 children) is less loaded than node 3 (1).
  auto e = registry_->Join(Request(Node(5, "h5"), {root}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->parent.id, Node(2, "h2").id);
  // `prefer` wins when it has room.
  JoinRequest again = Request(Node(5, "h5"), {root});
  again.prefer = Node(3, "h3").address;
  auto f = registry_->Join(again);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->parent.id, Node(3, "h3").id);
  auto loads = Loads();
  EXPECT_EQ(loads[Node(2, "h2").id], 0) << "re-joining frees the old slot";
  EXPECT_EQ(loads[Node(3, "h3").id], 2);
}

TEST_F(Placement, NeverUnderItsOwnDescendant) {
  NodeRecord root = Node(0, "h0");
  ASSERT_TRUE(registry_->Join(Request(Node(1, "h1"), {root})).ok());
  ASSERT_TRUE(registry_->Join(Request(Node(2, "h2"), {root})).ok());  // under 1
  ASSERT_TRUE(registry_->Join(Request(Node(3, "h3"), {root})).ok());  // under 1
  ASSERT_TRUE(registry_->Join(Request(Node(4, "h4"), {root})).ok());  // under 2
  // Node 1's parent (the root) died: node 1 re-joins avoiding it; every other candidate is its
  // descendant, so there is no place (and no cycle).
  JoinRequest r = Request(Node(1, "h1"), {root});
  r.avoid = {root.address};
  auto p = registry_->Join(r);
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound) << p.status().ToString();
  // Node 3 re-joins avoiding node 1 (its parent, presumed dead, leaves the tree): node 2 (depth 2,
  // one slot) takes it; the root's slot is free but avoided.
  r = Request(Node(3, "h3"), {root});
  r.avoid = {Node(1, "h1").address, root.address};
  p = registry_->Join(r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->parent.id, Node(2, "h2").id);
  // Node 2 re-joins avoiding the root: its only candidates are nodes 3 and 4, both below it.
  r = Request(Node(2, "h2"), {root});
  r.avoid = {root.address};
  p = registry_->Join(r);
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound) << p.status().ToString();
}

// A chain (one child each): the child of a dead relay avoids it; the dead relay leaves the tree, so
// its slot at its own parent is the child's at once (not after the TTL), and never a slot below
// the child itself.
TEST_F(Placement, AChainHealsPastADeadRelayAtOnce) {
  NodeRecord root = Node(0, "h0");
  for (int i = 1; i <= 4; ++i) {
    auto p = registry_->Join(Request(Node(i, "h" + std::to_string(i)), {root}, 1));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->depth, static_cast<uint32_t>(i));
  }
  JoinRequest r = Request(Node(3, "h3"), {root}, 1);
  r.avoid = {Node(2, "h2").address};
  auto p = registry_->Join(r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->parent.id, Node(1, "h1").id);
  EXPECT_EQ(p->depth, 2u);
  auto stayed = registry_->Stay("m", Node(2, "h2").id, 10s);
  ASSERT_TRUE(stayed.ok());
  EXPECT_FALSE(*stayed) << "the presumed-dead relay is out of the tree; if alive, it joins again";
  auto loads = Loads();
  EXPECT_EQ(loads[Node(1, "h1").id], 1);
  EXPECT_EQ(loads[Node(3, "h3").id], 1);  // node 4 stays under node 3
}

TEST_F(Placement, MembershipsExpireUnlessTheyStay) {
  NodeRecord root = Node(0, "h0");
  JoinRequest r = Request(Node(1, "h1"), {root});
  r.ttl = 1s;  // long enough that the Stay below comes within it on a loaded machine
  ASSERT_TRUE(registry_->Join(r).ok());
  auto stayed = registry_->Stay("m", Node(1, "h1").id, 1s);
  ASSERT_TRUE(stayed.ok());
  EXPECT_TRUE(*stayed);
  std::this_thread::sleep_for(1500ms);
  stayed = registry_->Stay("m", Node(1, "h1").id, 1s);
  ASSERT_TRUE(stayed.ok());
  EXPECT_FALSE(*stayed) << "the TTL passed";
  // Its slot at the root is free again.
  auto p = registry_->Join(Request(Node(2, "h2"), {root}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parent.id, root.id);
  ASSERT_TRUE(registry_->Leave("m", Node(2, "h2").id).ok());
  EXPECT_TRUE(Loads().empty());
}

TEST_F(Placement, RefusesMalformedRequestsAndRecords) {
  JoinRequest r = Request(Node(1), {Node(0)});
  r.max_children = 0;
  auto p = registry_->Join(r);
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("max_children 0 must be from 1 to 1024"), std::string::npos) << p.status().ToString();
  r = Request(Node(1), {Node(0)});
  r.node.address = "no-port";
  EXPECT_EQ(registry_->Join(r).status().code(), StatusCode::kInvalidArgument);
  r = Request(Node(1), {Node(0)});
  r.model = "a:b";
  EXPECT_EQ(registry_->Join(r).status().code(), StatusCode::kInvalidArgument);
  // A member whose stored address is not host:port (written by someone else): the joiner that
  // would go under it gets a corruption error, not a bad address.
  auto c = redis_.Connect();
  ASSERT_TRUE(c->Run({"ZADD", "viper:tree:m", "99999999999999", "aaaaaaaaaaaaaaaa"}).ok());
  ASSERT_TRUE(c->Run({"HSET", "viper:tree:m:aaaaaaaaaaaaaaaa", "a", "bogus", "h", "x", "d", "-1", "c", "5"}).ok());
  p = registry_->Join(Request(Node(2, "h2"), {Node(0, "h0")}));
  EXPECT_EQ(p.status().code(), StatusCode::kCorruption) << p.status().ToString();
  auto embedded = OpenRegistry("embedded");
  ASSERT_TRUE(embedded.ok());
  EXPECT_EQ((*embedded)->Join(Request(Node(1), {Node(0)})).status().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace viper::testing
