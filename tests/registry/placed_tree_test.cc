// Fault rounds on a relay tree the registry arranged (docs/RELIABILITY.md "Relay trees placed by
// the registry"): a producer node and relays started with `viper serve --registry redis://...
// --relay-model M` and no --upstream, in real processes against a real redis-server. The tree
// respects its bounds (the producer takes one child, each relay --max-children: 1, a chain, and
// 2). A round kills a relay that has children (kill -9) while a version is being relayed; its
// children re-attach under another node found through the registry within about one heartbeat,
// the version in flight is finished from another holder, and a consumer on every surviving relay
// sees each version whole and bit-exact (never a torn one).
#include <gtest/gtest.h>

#include <signal.h>

#include <map>

#include "fleet.h"
#include "viper/subscriber.h"

namespace viper::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr size_t kBytes = 24 << 20;  // large enough that a kill can land mid-transfer
constexpr int kRelays = 6;
constexpr double kTtlS = 1.5;        // heartbeat 0.5 s

// A consumer of one relay that checks every version it makes live against the bytes published.
struct Checker {
  std::unique_ptr<Subscriber> sub;
  std::shared_ptr<std::atomic<int>> bad = std::make_shared<std::atomic<int>>(0);
  static Checker On(const std::string& relay) {
    Checker c;
    SubscriberOptions so;
    so.model = "m";
    so.connect = relay;
    so.wait_for_node = true;
    so.path = FetchPath::kRemote;
    so.name = "checker";
    auto s = Subscriber::Start(so);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return c;
    c.sub = std::move(s).value();
    c.sub->OnUpdate([bad = c.bad](const std::shared_ptr<const ModelVersion>& mv) {
      // The tensors' bytes (the header carries the node's stamp: version, model).
      Snapshot expected = SeededSnapshot(mv->version(), kBytes);
      auto got = mv->snapshot.data_region();
      auto want = expected.data_region();
      if (got.size() != want.size() || std::memcmp(got.data(), want.data(), got.size()) != 0) (*bad)++;
    });
    return c;
  }
};

class PlacedTree : public ::testing::TestWithParam<int> {  // --max-children
 protected:
  void SetUp() override {
    std::string why = redis_.Start();
    ASSERT_TRUE(why.empty()) << why;
  }
  std::unique_ptr<ServeProcess> StartRelay(int i) {
    std::filesystem::remove(dir_ / ("relay" + std::to_string(i) + ".addr"));  // a dead one's address
    std::vector<std::string> args{"--relay-model", "m", "--max-children", std::to_string(GetParam()), "--upstream-remote"};
    args.insert(args.end(), relay_args_.begin(), relay_args_.end());
    return std::make_unique<ServeProcess>(dir_, "relay" + std::to_string(i), redis_.url(), kTtlS, "127.0.0.1:0", args);
  }
  // child address -> parent address, as the registry holds the tree.
  std::map<std::string, std::string> Tree() {
    std::map<std::string, std::string> id_to_address, parent_of;
    auto c = redis_.Connect();
    auto members = c->Run({"ZRANGE", "viper:tree:m", "0", "-1"});
    if (!members.ok()) return {};
    std::map<std::string, std::string> parent_id;
    for (size_t i = 0; i < (*members)->elements; ++i) {
      std::string id((*members)->element[i]->str, (*members)->element[i]->len);
      auto f = c->Run({"HMGET", "viper:tree:m:" + id, "a", "p"});
      if (!f.ok() || (*f)->elements != 2 || (*f)->element[0]->type != REDIS_REPLY_STRING) continue;
      id_to_address[id] = std::string((*f)->element[0]->str, (*f)->element[0]->len);
      parent_id[id] = std::string((*f)->element[1]->str, (*f)->element[1]->len);
    }
    for (const auto& [id, p] : parent_id)
      parent_of[id_to_address[id]] = id_to_address.contains(p) ? id_to_address[p] : "root:" + p;
    return parent_of;
  }
  std::string Logs() {
    std::string out = producer_ ? "--- producer\n" + producer_->log() : "";
    for (size_t i = 0; i < relays_.size(); ++i)
      if (relays_[i]) out += "--- relay" + std::to_string(i) + "\n" + relays_[i]->log();
    return out;
  }

  // The node numbers versions 1, 2, ...: the seed is the version, so checkers know the bytes.
  bool Publish(uint64_t version) {
    auto v = client_->Publish("m", SeededSnapshot(version, kBytes).bytes(), version, 0);
    EXPECT_TRUE(v.ok() && *v == version) << (v.ok() ? std::to_string(*v) : v.status().ToString());
    return v.ok() && *v == version;
  }
  // The producer's node with version 1, kRelays relays started at once (their joins race), a
  // checker on each with version 1 live, and the tree whole in the registry.
  void Grow() {
    producer_ = std::make_unique<ServeProcess>(dir_, "producer", redis_.url(), kTtlS);
    ASSERT_FALSE(producer_->address().empty()) << producer_->log();
    client_ = ConnectTo(producer_->address());
    ASSERT_TRUE(client_);
    ASSERT_TRUE(Publish(1));
    for (int i = 0; i < kRelays; ++i) relays_.push_back(StartRelay(i));
    for (auto& r : relays_) ASSERT_FALSE(r->address().empty()) << Logs();
    for (auto& r : relays_) checkers_.push_back(Checker::On(r->address()));
    for (auto& c : checkers_) ASSERT_TRUE(c.sub->WaitFor(1, 30s).ok()) << Logs();
    // Memberships live by heartbeat (Stay): one that slipped on a loaded machine is back within a TTL.
    EXPECT_TRUE(WaitUntil([&] { return Tree().size() == static_cast<size_t>(kRelays); }, 10s)) << Logs();
  }
  // A relay that has children in the registry's tree (-1: none), and those children.
  int RelayWithChildren(std::vector<int>* children) {
    auto tree = Tree();
    for (int i = 0; i < kRelays; ++i) {
      children->clear();
      for (int j = 0; j < kRelays; ++j)
        if (j != i && tree[relays_[j]->address()] == relays_[i]->address()) children->push_back(j);
      if (!children->empty()) return i;
    }
    return -1;
  }

  RedisServer redis_;
  TempDir dir_;
  std::unique_ptr<ServeProcess> producer_;
  std::unique_ptr<Client> client_;  // to the producer's node
  std::vector<std::unique_ptr<ServeProcess>> relays_;
  std::vector<Checker> checkers_;
  std::vector<std::string> relay_args_;  // more `viper serve` arguments for every relay
};

TEST_P(PlacedTree, KilledRelaysChildrenReattachThroughTheRegistry) {
  Grow();
  if (HasFatalFailure()) return;
  uint64_t version = 1;
  auto publish = [&] { return Publish(version); };
  auto& checkers = checkers_;
  auto check_bounds = [&] {
    std::map<std::string, int> children;
    for (const auto& [child, parent] : Tree()) children[parent]++;
    for (const auto& [parent, n] : children) EXPECT_LE(n, parent.starts_with("root:") ? 1 : GetParam()) << parent << "\n" << Logs();
  };
  check_bounds();

  std::vector<double> heal_ms;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // A relay with children (not the one under the producer in round 0: any with children).
    std::vector<int> orphans;
    const int victim = RelayWithChildren(&orphans);
    ASSERT_GE(victim, 0) << Logs();
    std::map<int, int> rejoins_before;
    for (int i : orphans) rejoins_before[i] = CountLines(relays_[i]->log(), "re-joined the relay tree");
    ASSERT_FALSE(orphans.empty());
    // A new version on its way down the tree, then the kill while it is relayed.
    ++version;
    ASSERT_TRUE(publish());
    std::this_thread::sleep_for(5ms);
    auto killed_at = Clock::now();
    relays_[victim]->Kill();
    for (int i : orphans) {
      bool back = WaitUntil([&] { return CountLines(relays_[i]->log(), "re-joined the relay tree") > rejoins_before[i]; }, 10s);
      ASSERT_TRUE(back) << "relay" << i << " did not re-join\n" << Logs();
      heal_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count());
    }
    // Every surviving relay's consumer gets the version in flight and the next one.
    ++version;
    ASSERT_TRUE(publish());
    for (int i = 0; i < kRelays; ++i)
      if (i != victim) {
        EXPECT_TRUE(checkers[i].sub->WaitFor(version, 30s).ok()) << "relay" << i << "\n" << Logs();
      }
    auto tree = Tree();
    for (int i : orphans) EXPECT_NE(tree[relays_[i]->address()], relays_[victim]->address());
    // The killed relay comes back (on a new port) and joins again.
    checkers[victim].sub.reset();
    relays_[victim] = StartRelay(victim);
    ASSERT_FALSE(relays_[victim]->address().empty()) << Logs();
    checkers[victim] = Checker::On(relays_[victim]->address());
    EXPECT_TRUE(checkers[victim].sub->WaitFor(version, 30s).ok()) << Logs();
    check_bounds();
  }
  for (auto& c : checkers) EXPECT_EQ(c.bad->load(), 0) << "a consumer saw bytes that were not published";
  std::string figures;
  for (double ms : heal_ms) figures += " " + std::to_string(static_cast<int>(ms));
  std::printf("re-attached after a relay's kill -9, ms:%s\n", figures.c_str());
  // The figure against its target (<= 2 s) is the benchmark's (`viper bench --fanout --auto`); here a
  // bound that catches a relay that never healed by itself, with room for a loaded machine. Under a
  // sanitizer (seven instrumented nodes and Redis on 2 vCPUs) the bound is the wait's above.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr double kHealBoundMs = 10'000;
#else
  constexpr double kHealBoundMs = 4 * kTtlS * 1000;
#endif
  for (double ms : heal_ms) EXPECT_LT(ms, kHealBoundMs) << "about one heartbeat, with room for a loaded machine";
}

// 1: a chain (the default: docs/ARCHITECTURE.md "Placement and healing"); 2: a binary tree.
INSTANTIATE_TEST_SUITE_P(Children, PlacedTree, ::testing::Values(1, 2));

// A relay that goes silent (SIGSTOP: its connections stay open and nothing answers, as a host cut
// off from the network): its heartbeat stops too, so the registry drops it within a TTL, and its
// children notice the silence by their liveness probe (`--upstream-liveness 2`: 2 s of silence,
// 2 s without an answer), then re-join under another node found through the registry and take
// the next version from it.
using FrozenTree = PlacedTree;
TEST_P(FrozenTree, FrozenRelaysChildrenReattachThroughTheRegistry) {
  relay_args_ = {"--upstream-liveness", "2"};
  Grow();
  if (HasFatalFailure()) return;
  std::vector<int> orphans;
  const int victim = RelayWithChildren(&orphans);
  ASSERT_GE(victim, 0) << Logs();
  std::map<int, int> rejoins_before;
  for (int i : orphans) rejoins_before[i] = CountLines(relays_[i]->log(), "re-joined the relay tree");
  auto frozen_at = Clock::now();
  ::kill(relays_[victim]->process().pid(), SIGSTOP);
  ASSERT_TRUE(Publish(2));
  std::vector<double> heal_ms;
  for (int i : orphans) {
    bool back = WaitUntil([&] { return CountLines(relays_[i]->log(), "re-joined the relay tree") > rejoins_before[i]; }, 40s);
    EXPECT_TRUE(back) << "relay" << i << " did not leave its frozen parent\n" << Logs();
    heal_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - frozen_at).count());
  }
  for (int i = 0; i < kRelays; ++i) {
    if (i == victim) continue;
    EXPECT_TRUE(checkers_[i].sub->WaitFor(2, 30s).ok()) << "relay" << i << "\n" << Logs();
  }
  auto tree = Tree();
  EXPECT_FALSE(tree.contains(relays_[victim]->address())) << "the frozen relay is still a member";
  for (int i : orphans) EXPECT_NE(tree[relays_[i]->address()], relays_[victim]->address());
  for (int i : orphans) {
    EXPECT_NE(relays_[i]->log().find("did not answer a probe"), std::string::npos) << relays_[i]->log();
    // Reported unreachable at once: not connected to again first (which waits out the connect
    // timeout: healed in 15 s instead of 10).
    EXPECT_EQ(CountLines(relays_[i]->log(), "cannot connect to node " + relays_[victim]->address()), 0) << relays_[i]->log();
  }
  std::string figures;
  for (double ms : heal_ms) figures += " " + std::to_string(static_cast<int>(ms));
  std::printf("re-attached after a relay froze, ms:%s\n", figures.c_str());
  for (double ms : heal_ms) EXPECT_LT(ms, 9000) << "--upstream-liveness 2 (the default 5 s takes 10 s)";
  ::kill(relays_[victim]->process().pid(), SIGCONT);
  for (auto& c : checkers_) EXPECT_EQ(c.bad->load(), 0) << "a consumer saw bytes that were not published";
}
INSTANTIATE_TEST_SUITE_P(Chain, FrozenTree, ::testing::Values(1));

}  // namespace
}  // namespace viper::testing
