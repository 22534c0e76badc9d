// Subscriber::OnUpdate: a callback set after Start gets the version that went live in between,
// then every later one, in order and once each (real Publisher with its embedded node, UCX on
// loopback, shared memory).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/registry.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;

struct Seen {
  std::mutex mu;
  std::vector<uint64_t> versions;
  std::vector<std::thread::id> threads;
  void Add(uint64_t v) {
    std::lock_guard<std::mutex> lock(mu);
    versions.push_back(v);
    threads.push_back(std::this_thread::get_id());
  }
  std::vector<uint64_t> Versions() {
    std::lock_guard<std::mutex> lock(mu);
    return versions;
  }
};

std::unique_ptr<Publisher> StartPublisher(const std::string& prefix) {
  PublisherOptions options;
  options.model = "m";
  options.mode = PublishMode::kSync;
  options.node.segment_prefix = prefix;
  auto pub = Publisher::Start(options);
  EXPECT_TRUE(pub.ok()) << pub.status().ToString();
  return pub.ok() ? std::move(pub).value() : nullptr;
}

Status PublishOne(Publisher& pub, uint8_t fill) {
  std::vector<uint8_t> bytes(4096, fill);
  std::vector<TensorData> tensors = {{{"w", DType::kU8, {4096}}, std::as_bytes(std::span(bytes))}};
  return pub.Publish(tensors).status();
}

std::unique_ptr<Subscriber> StartSubscriber(const Publisher& pub) {
  SubscriberOptions options;
  options.model = "m";
  options.connect = pub.address();
  options.path = FetchPath::kMap;
  auto sub = Subscriber::Start(options);
  EXPECT_TRUE(sub.ok()) << sub.status().ToString();
  return sub.ok() ? std::move(sub).value() : nullptr;
}

// The race a consumer used to lose: the live version loaded between Start and OnUpdate never
// reached the callback (a bench waiting for it waited for ever).
TEST(SubscriberCallback, LiveVersionReachesACallbackSetAfterIt) {
  auto pub = StartPublisher("viper-callback-test-a");
  ASSERT_NE(pub, nullptr);
  ASSERT_TRUE(PublishOne(*pub, 1).ok());
  auto sub = StartSubscriber(*pub);
  ASSERT_NE(sub, nullptr);
  ASSERT_TRUE(sub->WaitFor(1, 10s).ok()) << sub->last_error().ToString();
  Seen seen;
  sub->OnUpdate([&](const std::shared_ptr<const ModelVersion>& mv) { seen.Add(mv->version()); });
  ASSERT_EQ(seen.Versions(), std::vector<uint64_t>{1}) << "the live version, before OnUpdate returned";
  EXPECT_EQ(seen.threads[0], std::this_thread::get_id());
  ASSERT_TRUE(PublishOne(*pub, 2).ok());
  ASSERT_TRUE(sub->WaitFor(2, 10s).ok());
  for (int i = 0; i < 200 && seen.Versions().size() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(seen.Versions(), (std::vector<uint64_t>{1, 2}));
  EXPECT_NE(seen.threads[1], std::this_thread::get_id()) << "later versions arrive on the loader thread";
}

// Callbacks set while versions go live: each sees strictly increasing versions, none twice, and
// the last one published.
TEST(SubscriberCallback, CallbacksSetDuringPublishingSeeVersionsInOrderOnce) {
  auto pub = StartPublisher("viper-callback-test-b");
  ASSERT_NE(pub, nullptr);
  ASSERT_TRUE(PublishOne(*pub, 0).ok());
  auto sub = StartSubscriber(*pub);
  ASSERT_NE(sub, nullptr);
  constexpr int kVersions = 120, kCallbacks = 6;
  std::atomic<bool> failed{false};
  std::thread producer([&] {
    for (int i = 1; i < kVersions && !failed; ++i)
      if (!PublishOne(*pub, static_cast<uint8_t>(i)).ok()) failed = true;
  });
  std::vector<Seen> seen(kCallbacks);
  for (int k = 0; k < kCallbacks; ++k) {
    std::this_thread::sleep_for(5ms);
    sub->OnUpdate([&seen, k](const std::shared_ptr<const ModelVersion>& mv) { seen[k].Add(mv->version()); });
  }
  producer.join();
  ASSERT_FALSE(failed);
  ASSERT_TRUE(sub->WaitFor(kVersions, 20s).ok()) << sub->last_error().ToString();
  for (int k = 0; k < kCallbacks; ++k) {
    for (int i = 0; i < 200 && (seen[k].Versions().empty() || seen[k].Versions().back() != kVersions); ++i)
      std::this_thread::sleep_for(10ms);
    std::vector<uint64_t> v = seen[k].Versions();
    ASSERT_FALSE(v.empty()) << "callback " << k;
    EXPECT_EQ(v.back(), static_cast<uint64_t>(kVersions)) << "callback " << k;
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(v[i - 1], v[i]) << "callback " << k << " at " << i;
  }
}

// on_connection through a registry: a node on this host announcing the version the subscriber
// already has makes it leave the remote node it reached first (OnRegistryAnnounce drops that
// connection). The loader must be woken to connect there: it used to sleep until the next version,
// subscribed to no node meanwhile (a registry outage then cut it off from every announcement).
TEST(SubscriberCallback, MovesToANodeOnThisHostAnnouncingTheLiveVersion) {
  const std::string model = "callback-registry-move";
  PublisherOptions po;
  po.model = model;
  po.mode = PublishMode::kSync;
  po.node.segment_prefix = "viper-callback-test-c";
  auto pub = Publisher::Start(po);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  std::vector<uint8_t> bytes(4096, 7);
  std::vector<TensorData> tensors = {{{"w", DType::kU8, {4096}}, std::as_bytes(std::span(bytes))}};
  ASSERT_TRUE((*pub)->Publish(tensors).ok());
  NodeOptions no;
  no.segment_prefix = "viper-callback-test-d";
  auto near = Node::Start(no);
  ASSERT_TRUE(near.ok()) << near.status().ToString();
  auto registry = OpenRegistry("embedded");
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  std::optional<proto::VersionInfo> info = (*pub)->node().Latest(model);
  ASSERT_TRUE(info.has_value());
  // The producer's node as if on another host: the subscriber connects there first.
  HolderRecord far{NodeRecordFor("far", (*pub)->address(), "another-host", 1), *info};
  ASSERT_TRUE((*registry)->Put(std::span(&far, 1), 60s).ok());

  std::mutex mu;
  std::vector<std::string> nodes;
  auto last_node = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return nodes.empty() ? std::string("(none)") : nodes.back();
  };
  SubscriberOptions so;
  so.model = model;
  so.registry = "embedded";
  so.on_connection = [&](const std::string& node, bool, const SubscriberStats&) {
    std::lock_guard<std::mutex> lock(mu);
    nodes.push_back(node);
  };
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_TRUE((*sub)->WaitFor(1, 10s).ok()) << (*sub)->last_error().ToString();
  ASSERT_EQ(last_node(), (*pub)->address());

  // A node on this host announces version 1 too.
  HolderRecord here{NodeRecordFor("here", (*near)->address(), LocalHostKey(), 2), *info};
  here.info.replicas = {{proto::ReplicaKind::kNode, LocalHostKey(), (*near)->address()}};
  auto put = (*registry)->Put(std::span(&here, 1), 60s);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  ASSERT_TRUE((*registry)->Announce(here).ok());
  // Moved by the announcement alone (the subscriber does not poll the registry): 20 s of slack for
  // a sanitizer build on a loaded machine.
  for (int i = 0; i < 2000 && last_node() != (*near)->address(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(last_node(), (*near)->address()) << "still not connected to the node on this host 20 s after its announcement";
  sub->reset();
  (void)(*registry)->Remove(far.node.id, model, 1);
  (void)(*registry)->Remove(here.node.id, model, 1);
}

// The liveness probe of a quiet connection to a node that answers never gives it up: probed a few
// times while no version comes, the subscriber stays connected and takes the next version.
TEST(SubscriberLiveness, AQuietNodeThatAnswersIsKept) {
  auto pub = StartPublisher("viper-callback-test-l");
  ASSERT_TRUE(pub);
  ASSERT_TRUE(PublishOne(*pub, 1).ok());
  SubscriberOptions options;
  options.model = "m";
  options.connect = pub->address();
  options.liveness_probe = 100ms;
  options.liveness_timeout = 2000ms;
  auto sub = Subscriber::Start(options);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_TRUE((*sub)->WaitFor(1, 30s).ok());
  std::this_thread::sleep_for(1200ms);  // about ten probes, each answered
  ASSERT_TRUE(PublishOne(*pub, 2).ok());
  auto second = (*sub)->WaitFor(2, 30s);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  SubscriberStats stats = (*sub)->stats();
  EXPECT_EQ(stats.liveness_failures, 0u);
  EXPECT_EQ(stats.connect_failures, 0u);
  EXPECT_EQ(pub->node().stats().peers, 1u) << "the subscriber reconnected";
  options.liveness_timeout = 0ms;  // every probe would fail at once
  auto refused = Subscriber::Start(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
}

}  // namespace
}  // namespace viper
