// Cut-through from the producer (issue 28 item 5) inside one process: a version is announced to
// remote readers while its producer still writes it (Node::Produce), its chunks go out as the
// landed watermark passes them, its checksum and final header come last (SEALED), and only a
// complete, verified version goes live anywhere; one abandoned midway never does. Real nodes,
// real UCX over loopback (consumers take the remote path, as on another host). The cross-host
// version with a producer killed mid-copy is tests/xnode/cut_through_test.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "api/test_hooks.h"
#include "process.h"
#include "store/host_tier.h"
#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/relay.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using testing::Settled;
using testing::WaitUntil;
using namespace std::chrono_literals;

constexpr std::string_view kCutThrough = "cut-through";

// One version of model "m" as a producer writes it: the layout, the final bytes (header stamped
// with the checksum) and the provisional header written before the data (checksum 0).
struct Version {
  uint64_t version = 0;
  SnapshotLayout layout;
  std::vector<std::byte> final;
  std::vector<std::byte> provisional_header;
  uint64_t checksum = 0;
};

Version MakeVersion(uint64_t bytes, uint64_t version, uint32_t seed) {
  Version v;
  v.version = version;
  auto layout = SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(bytes)}}});
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  v.layout = std::move(layout).value();
  v.final.assign(v.layout.total_bytes(), std::byte{0});
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = v.layout.data_offset(); i < v.final.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    v.final[i] = static_cast<std::byte>(x >> 24);
  }
  v.checksum = checksum64(std::span<const std::byte>(v.final).subspan(v.layout.data_offset()));
  VersionStamp stamp{"m", version, 7 * version, 1, 0, std::nullopt};
  v.provisional_header.resize(v.layout.data_offset());
  EXPECT_TRUE(v.layout.WriteHeader(v.provisional_header, stamp).ok());
  stamp.checksum = v.checksum;
  EXPECT_TRUE(v.layout.WriteHeader(v.final, stamp).ok());
  return v;
}

proto::VersionInfo InfoOf(const Version& v) {
  proto::VersionInfo info;
  info.model = "m";
  info.version = v.version;
  info.size = v.final.size();
  info.checksum = v.checksum;
  info.step = 7 * v.version;
  return info;
}

// A version being produced on `node`: provisional header, then data as Write() says.
struct Producing {
  const Version& v;
  std::unique_ptr<IncomingVersion> in;

  Producing(Node& node, const Version& version) : v(version) {
    auto lease = node.Allocate(v.final.size());
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    if (!lease.ok()) return;
    std::memcpy(lease->data().data(), v.provisional_header.data(), v.provisional_header.size());
    proto::VersionInfo info = InfoOf(v);
    info.checksum = 0;
    auto produced = node.Produce(std::move(lease).value(), info);
    EXPECT_TRUE(produced.ok()) << produced.status().ToString();
    if (produced.ok()) in = std::move(produced).value();
  }
  // Copies the data up to byte `to` of the snapshot and advances the watermark.
  void Write(uint64_t to) {
    uint64_t from = std::max<uint64_t>(v.layout.data_offset(), landed);
    std::memcpy(in->data().data() + from, v.final.data() + from, to - from);
    in->Landed(to);
    landed = to;
  }
  Status SealAndCommit() {
    std::memcpy(in->data().data(), v.final.data(), v.layout.data_offset());  // the final header
    VIPER_RETURN_IF_ERROR(in->Seal(InfoOf(v)));
    return in->Commit().status();
  }
  uint64_t landed = 0;
};

std::unique_ptr<Node> StartNode() {
  auto node = Node::Start(NodeOptions{});
  EXPECT_TRUE(node.ok()) << node.status().ToString();
  return node.ok() ? std::move(node).value() : nullptr;
}

// A consumer of "m" on `node` that fetches over UCX (as one on another host does) and records
// every version that goes live there.
struct Consumer {
  std::unique_ptr<Subscriber> sub;
  std::mutex mu;
  std::vector<uint64_t> live;

  explicit Consumer(const Node& node, FetchPath path = FetchPath::kRemote) {
    SubscriberOptions so;
    so.model = "m";
    so.connect = node.address();
    so.path = path;
    so.chunk_bytes = 1 << 20;
    so.verify_local = true;
    auto started = Subscriber::Start(so);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (!started.ok()) return;
    sub = std::move(started).value();
    sub->OnUpdate([this](const std::shared_ptr<const ModelVersion>& mv) {
      std::lock_guard<std::mutex> lock(mu);
      live.push_back(mv->version());
    });
  }
  std::vector<uint64_t> Live() {
    std::lock_guard<std::mutex> lock(mu);
    return live;
  }
  // The versions gone live once the callback saw `last` (WaitFor returns when the version is
  // live; its callback runs right after, on the subscriber's thread).
  std::vector<uint64_t> LiveUpTo(uint64_t last) {
    WaitUntil([&] {
      std::lock_guard<std::mutex> lock(mu);
      return !live.empty() && live.back() >= last;
    }, std::chrono::seconds(10));
    return Live();
  }
};

void ExpectBitExact(const ModelVersion& mv, const Version& v) {
  EXPECT_EQ(mv.version(), v.version);
  EXPECT_EQ(mv.info.checksum, v.checksum);
  ASSERT_EQ(mv.snapshot.bytes().size(), v.final.size());
  EXPECT_TRUE(std::memcmp(mv.snapshot.bytes().data(), v.final.data(), v.final.size()) == 0)
      << "version " << v.version << " differs from what the producer wrote (header included)";
}

// A Publisher of "m" whose node calls `on_landed` (NodeTestHooks::publish_landed, with the node)
// as a version announced early lands, a consumer on the remote path (an early reader) and one that
// maps; started once the node counts the remote one as an early reader.
struct PublisherWithReaders {
  std::atomic<Node*> node_of{nullptr};
  std::unique_ptr<Publisher> publisher;
  std::unique_ptr<Consumer> remote, mapper;

  void Start(PublishMode mode, std::function<void(Node&, uint64_t version, uint64_t landed, uint64_t size)> on_landed) {
    PublisherOptions po;
    po.model = "m";
    po.mode = mode;
    auto hooks = std::make_shared<NodeTestHooks>();
    hooks->publish_landed = [this, on_landed](const std::string&, uint64_t version, uint64_t landed, uint64_t size) {
      on_landed(*node_of.load(), version, landed, size);
    };
    po.node.test_hooks = hooks;
    auto started = Publisher::Start(po);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    publisher = std::move(started).value();
    node_of = &publisher->node();
    remote = std::make_unique<Consumer>(publisher->node());
    mapper = std::make_unique<Consumer>(publisher->node(), FetchPath::kMap);
    ASSERT_TRUE(remote->sub && mapper->sub);
    ASSERT_TRUE(WaitUntil([&] { return publisher->node().HasEarlyReaders("m"); }, 30s));
  }
};

// The consumer receives the first half while the producer has not written the rest: nothing is
// live until the producer seals, then the whole version is, bit-exact, header and checksum final.
TEST(CutThrough, RemoteConsumerReceivesWhileTheProducerWrites) {
  auto node = StartNode();
  ASSERT_TRUE(node);
  Consumer consumer(*node);
  ASSERT_TRUE(consumer.sub);
  ASSERT_TRUE(WaitUntil([&] { return node->HasEarlyReaders("m"); }, 30s));
  Version v = MakeVersion(24 << 20, 1, 1);
  Producing p(*node, v);
  ASSERT_TRUE(p.in);
  const uint64_t half = v.final.size() / 2;
  p.Write(half);
  ASSERT_TRUE(WaitUntil([&] { return node->stats().bytes_sent_incoming >= 8u << 20; }, 30s))
      << "the consumer never received the written half early";
  EXPECT_EQ(consumer.sub->latest(), nullptr) << "a version went live before it was complete";
  EXPECT_FALSE(node->Latest("m").has_value()) << "a version being produced must not be in the catalog";
  std::this_thread::sleep_for(100ms);  // nothing more can go: the rest is not written
  EXPECT_LE(node->stats().bytes_sent_incoming, half);
  p.Write(v.final.size());
  ASSERT_TRUE(p.SealAndCommit().ok());
  auto mv = consumer.sub->WaitFor(1, 30s);
  ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; " << consumer.sub->last_error().ToString();
  ExpectBitExact(**mv, v);
  EXPECT_NE((*mv)->reason.find(kCutThrough), std::string::npos) << (*mv)->reason;
  EXPECT_EQ((*mv)->path, FetchPath::kRemote);
  EXPECT_EQ(node->stats().produced_early, 1u);
  EXPECT_EQ(Settled([&] { return node->stats().bytes_sent; }, v.final.size()), v.final.size()) << "one copy to the one consumer";
  EXPECT_EQ(node->Latest("m")->checksum, v.checksum);
  EXPECT_EQ(consumer.LiveUpTo(1), std::vector<uint64_t>{1});
}

// A version abandoned midway (its producer failed before sealing) is never live anywhere: the
// consumer that got its first chunks drops them (ERROR Aborted at once, not a timeout), keeps
// serving the version it had, and takes the next complete one.
TEST(CutThrough, AbandonedVersionNeverGoesLive) {
  auto node = StartNode();
  ASSERT_TRUE(node);
  Consumer consumer(*node);
  ASSERT_TRUE(consumer.sub);
  ASSERT_TRUE(WaitUntil([&] { return node->HasEarlyReaders("m"); }, 30s));
  Version v1 = MakeVersion(6 << 20, 1, 11);
  {
    Producing p(*node, v1);
    ASSERT_TRUE(p.in);
    p.Write(v1.final.size());
    ASSERT_TRUE(p.SealAndCommit().ok());
  }
  ASSERT_TRUE(consumer.sub->WaitFor(1, 30s).ok());
  Version v2 = MakeVersion(16 << 20, 2, 12);
  const uint64_t before = node->stats().bytes_sent_incoming;
  ::testing::internal::CaptureStderr();  // what the node and the consumer say of the abandoned version
  {
    Producing p(*node, v2);
    ASSERT_TRUE(p.in);
    p.Write(v2.final.size() / 2);
    ASSERT_TRUE(WaitUntil([&] { return node->stats().bytes_sent_incoming >= before + (4u << 20); }, 30s))
        << "the consumer never received version 2's first chunks";
  }  // abandoned: destroyed without Seal and Commit
  ASSERT_TRUE(WaitUntil([&] { return consumer.sub->stats().fetch_failures >= 1; }, 10s))
      << "the consumer did not drop the abandoned version promptly";
  EXPECT_EQ(node->stats().incoming_aborted, 1u);
  EXPECT_EQ(node->Latest("m")->version, 1u);
  auto still = consumer.sub->latest();
  ASSERT_NE(still, nullptr);
  ExpectBitExact(*still, v1);
  Version v3 = MakeVersion(8 << 20, 3, 13);
  Producing p3(*node, v3);
  ASSERT_TRUE(p3.in);
  EXPECT_EQ(p3.in->info().version, 3u);
  p3.Write(v3.final.size());
  ASSERT_TRUE(p3.SealAndCommit().ok());
  auto mv = consumer.sub->WaitFor(3, 30s);
  ASSERT_TRUE(mv.ok()) << mv.status().ToString();
  ExpectBitExact(**mv, v3);
  EXPECT_EQ(consumer.LiveUpTo(3), (std::vector<uint64_t>{1, 3})) << "the abandoned version 2 went live";
  // The consumer's transfer (half landed) ends with the reason: its producer abandoned the
  // version (not "the transfer into this node broke off", nor to fetch it from another replica:
  // no node has it). It is tried once: not again after the reconnect that followed the broken
  // transfer (the node would answer "no version 2"), and not reported as this consumer's error.
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("m version 2 aborted: its producer abandoned it before sealing it"), std::string::npos) << said;
  EXPECT_EQ(said.find("another replica"), std::string::npos) << said;
  EXPECT_EQ(said.find("broke off"), std::string::npos) << said;
  EXPECT_EQ(said.find("no version 2"), std::string::npos) << said;
  EXPECT_EQ(said.find(" error subscriber"), std::string::npos) << said;
  EXPECT_EQ(consumer.sub->stats().fetch_failures, 1u);
}

// Seal refuses what is not the version announced, and Commit what is not sealed.
TEST(CutThrough, SealAndCommitCheckTheirPreconditions) {
  auto node = StartNode();
  ASSERT_TRUE(node);
  Version v = MakeVersion(2 << 20, 1, 21);
  Producing p(*node, v);
  ASSERT_TRUE(p.in);
  EXPECT_FALSE(p.in->sealed());
  p.Write(v.final.size() / 2);
  EXPECT_EQ(p.in->Seal(InfoOf(v)).code(), StatusCode::kFailedPrecondition) << "sealed with bytes missing";
  p.Write(v.final.size());
  EXPECT_EQ(p.in->Commit().status().code(), StatusCode::kFailedPrecondition) << "committed unsealed";
  proto::VersionInfo other = InfoOf(v);
  other.version = 2;
  EXPECT_EQ(p.in->Seal(other).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.SealAndCommit().ok());
  EXPECT_TRUE(p.in->sealed());
  auto lease = node->host_tier().Acquire("m", 1);
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(std::memcmp(lease->data().data(), v.final.data(), v.final.size()) == 0);
  // A segment that does not start with a header that fits is refused.
  auto bad = node->Allocate(64);
  ASSERT_TRUE(bad.ok());
  std::memset(bad->data().data(), 0xff, 8);
  proto::VersionInfo info;
  info.model = "m";
  info.version = 5;
  info.size = 64;
  EXPECT_EQ(node->Produce(std::move(bad).value(), info).status().code(), StatusCode::kInvalidArgument);
}

// The embedded Publisher announces each version as it starts copying when a remote reader is
// subscribed; remote consumers get every version bit-exact through the cut-through, and a consumer
// that maps (same host) sees only complete versions, as before.
TEST(CutThrough, PublisherFeedsRemoteConsumersWhileItCopies) {
  // Half way through each copy, Publish waits until the remote consumer has received bytes of the
  // version (at most 10 s): its chunks go out while the publish is still running, however slowly
  // this machine schedules the consumer. The count to pass is the one before the version was
  // published (each version is whole at both consumers before the next): a fast consumer may
  // already have everything that landed by the time the hook runs, and nothing more lands while
  // the hook waits.
  std::atomic<uint64_t> paused{0}, received_while_copying{0}, sent_before_version{0};
  PublisherWithReaders p;
  ASSERT_NO_FATAL_FAILURE(p.Start(PublishMode::kAsync, [&](Node& n, uint64_t version, uint64_t landed, uint64_t size) {
    if (landed < size / 2 || paused.exchange(version) == version) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (WaitUntil([&] { return n.stats().bytes_sent_incoming > sent_before_version.load(); }, 10s)) received_while_copying++;
  }));
  auto& publisher = p.publisher;
  Node& node = publisher->node();
  Consumer& remote = *p.remote;
  Consumer& mapper = *p.mapper;
  for (uint64_t i = 1; i <= 3; ++i) {
    std::vector<std::vector<std::byte>> data(4, std::vector<std::byte>(6 << 20));
    uint32_t x = static_cast<uint32_t>(i) * 7919u;
    for (auto& t : data)
      for (auto& b : t) b = static_cast<std::byte>((x = x * 1664525u + 1013904223u) >> 24);
    std::vector<TensorData> tensors;
    for (size_t t = 0; t < data.size(); ++t)
      tensors.push_back({{"t" + std::to_string(t), DType::kU8, {static_cast<int64_t>(data[t].size())}}, data[t]});
    PublishInfo pi;
    pi.step = i;
    sent_before_version = node.stats().bytes_sent_incoming;
    auto published = publisher->Publish(tensors, pi);
    ASSERT_TRUE(published.ok()) << published.status().ToString();
    for (Consumer* c : {&remote, &mapper}) {
      auto mv = c->sub->WaitFor(published->version, 60s);
      ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; " << c->sub->last_error().ToString();
      EXPECT_EQ((*mv)->version(), published->version);
      for (size_t t = 0; t < data.size(); ++t) {
        const TensorInfo* info = (*mv)->snapshot.find("t" + std::to_string(t));
        ASSERT_NE(info, nullptr);
        auto view = (*mv)->snapshot.tensor_data(*info);
        ASSERT_EQ(view.size(), data[t].size());
        EXPECT_TRUE(std::memcmp(view.data(), data[t].data(), data[t].size()) == 0);
      }
      EXPECT_EQ((*mv)->info.checksum, (*mv)->snapshot.compute_checksum());
      EXPECT_EQ((*mv)->snapshot.metadata().at("viper.step"), std::to_string(i)) << "the header is not the final one";
    }
    EXPECT_NE(remote.sub->latest()->reason.find(kCutThrough), std::string::npos) << remote.sub->latest()->reason;
  }
  ASSERT_TRUE(publisher->Wait().ok());
  EXPECT_EQ(received_while_copying.load(), 3u) << "a version's chunks did not go out while Publish copied it";
  EXPECT_EQ(node.stats().produced_early, 3u);
  EXPECT_EQ(remote.LiveUpTo(3), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(mapper.LiveUpTo(3), (std::vector<uint64_t>{1, 2, 3}));
}

// A draft (Begin, written in place, Commit) is announced to remote readers as Commit is called:
// they receive it while the seal computes its checksum, and it goes live bit-exact with the final
// header, there and on a consumer that maps it. A Commit refused for its metadata tells nobody of
// the version and takes no version number.
TEST(CutThrough, ACommittedDraftReachesRemoteReadersWhileItIsSealed) {
  // Before the seal starts (sync: the seal runs in Commit, after the hook), Commit waits until the
  // remote consumer has received bytes of the version (at most 10 s). Every byte has landed, so
  // the node counts what it sends as bytes_sent (not bytes_sent_incoming); the mapper sends nothing.
  // The count to pass is the one before Commit (a consumer may have it all before the hook runs).
  std::atomic<uint64_t> received_before_seal{0}, sent_before_version{0};
  PublisherWithReaders p;
  ASSERT_NO_FATAL_FAILURE(p.Start(PublishMode::kSync, [&](Node& n, uint64_t, uint64_t landed, uint64_t size) {
    if (landed != size) return;
    if (WaitUntil([&] { return n.stats().bytes_sent > sent_before_version.load(); }, 10s)) received_before_seal++;
  }));
  auto& publisher = p.publisher;
  Node& node = publisher->node();
  Consumer& remote = *p.remote;
  Consumer& mapper = *p.mapper;
  const std::vector<TensorSpec> specs = {{"a", DType::kU8, {8 << 20}}, {"b", DType::kF32, {1 << 20}}};
  for (uint64_t i = 1; i <= 3; ++i) {
    auto draft = publisher->Begin(specs, {{"run", "r1"}});
    ASSERT_TRUE(draft.ok()) << draft.status().ToString();
    uint32_t x = static_cast<uint32_t>(i) * 7919u;
    for (const auto& spec : specs)
      for (auto& b : draft->tensor(spec.name)) b = static_cast<std::byte>((x = x * 1664525u + 1013904223u) >> 24);
    std::vector<std::vector<std::byte>> written;
    for (const auto& spec : specs) {
      auto t = draft->tensor(spec.name);
      written.emplace_back(t.begin(), t.end());
    }
    PublishInfo pi;
    pi.step = i;
    sent_before_version = node.stats().bytes_sent;
    auto committed = publisher->Commit(std::move(*draft), pi);
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
    EXPECT_EQ(committed->version, i);
    for (Consumer* c : {&remote, &mapper}) {
      auto mv = c->sub->WaitFor(i, 60s);
      ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; " << c->sub->last_error().ToString();
      for (size_t t = 0; t < specs.size(); ++t) {
        auto view = (*mv)->snapshot.tensor_data(*(*mv)->snapshot.find(specs[t].name));
        ASSERT_EQ(view.size(), written[t].size());
        EXPECT_TRUE(std::memcmp(view.data(), written[t].data(), view.size()) == 0) << specs[t].name;
      }
      EXPECT_EQ((*mv)->info.checksum, (*mv)->snapshot.compute_checksum());
      EXPECT_EQ((*mv)->snapshot.metadata().at("viper.step"), std::to_string(i)) << "the header is not the final one";
      EXPECT_EQ((*mv)->snapshot.metadata().at("run"), "r1");
    }
    EXPECT_NE(remote.sub->latest()->reason.find(kCutThrough), std::string::npos) << remote.sub->latest()->reason;
  }
  EXPECT_EQ(received_before_seal.load(), 3u) << "a draft's bytes did not go out before its seal";
  EXPECT_EQ(node.stats().produced_early, 3u);

  auto refused = publisher->Begin(specs, {{"run", "r1"}});
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  PublishInfo other;
  other.metadata = {{"run", "r2"}};
  auto st = publisher->Commit(std::move(*refused), other);
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status().ToString();
  EXPECT_EQ(node.stats().produced_early, 3u) << "a refused commit was announced";
  auto next = publisher->Begin(specs, {{"run", "r1"}});
  ASSERT_TRUE(next.ok());
  auto fourth = publisher->Commit(std::move(*next), {});
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_EQ(fourth->version, 4u) << "the refused commit took a version number";
  EXPECT_EQ(remote.LiveUpTo(4), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(mapper.LiveUpTo(4), (std::vector<uint64_t>{1, 2, 3, 4}));
}

// Publish and Commit called at once from two threads, with remote readers (both announce early):
// versions are numbered, sealed and committed in call order, and every version a consumer sees go
// live is whole: one writer's bytes, its checksum, in increasing version order.
TEST(CutThrough, ConcurrentPublishesAndCommitsStayWholeAndInOrder) {
  PublisherWithReaders p;
  ASSERT_NO_FATAL_FAILURE(p.Start(PublishMode::kAsync, [](Node&, uint64_t, uint64_t, uint64_t) {}));
  Publisher& publisher = *p.publisher;
  // Tensor "id" holds (writer, round); every byte of "a" is a function of it.
  const std::vector<TensorSpec> specs = {{"id", DType::kU32, {2}}, {"a", DType::kU8, {3 << 20}}};
  auto fill = [](uint32_t writer, uint32_t round) { return static_cast<std::byte>(writer * 64 + round + 1); };
  std::mutex mu;
  std::vector<std::string> torn;  // what a consumer saw that no writer wrote
  for (Consumer* c : {p.remote.get(), p.mapper.get()}) {
    c->sub->OnUpdate([&](const std::shared_ptr<const ModelVersion>& mv) {  // beside Consumer's own
      const auto id = mv->snapshot.tensor_data(*mv->snapshot.find("id"));
      const auto a = mv->snapshot.tensor_data(*mv->snapshot.find("a"));
      uint32_t who[2];
      std::memcpy(who, id.data(), sizeof(who));
      const bool whole = mv->info.checksum == mv->snapshot.compute_checksum() &&
                         std::all_of(a.begin(), a.end(), [&](std::byte b) { return b == fill(who[0], who[1]); });
      std::lock_guard<std::mutex> lock(mu);
      if (!whole) torn.push_back("version " + std::to_string(mv->version()));
    });
  }
  constexpr uint32_t kRounds = 6;
  std::vector<uint64_t> versions[2];
  auto writer = [&](uint32_t w) {
    std::vector<std::byte> a(3 << 20);
    for (uint32_t round = 0; round < kRounds; ++round) {
      const uint32_t who[2] = {w, round};
      std::fill(a.begin(), a.end(), fill(w, round));
      Result<PublishResult> r = Status::OK();
      if (w == 0) {  // Publish: copied in
        r = publisher.Publish({{specs[0], std::as_bytes(std::span(who))}, {specs[1], a}}, {});
      } else {  // Begin, written in place, Commit
        auto draft = publisher.Begin(specs);
        ASSERT_TRUE(draft.ok()) << draft.status().ToString();
        std::memcpy(draft->tensor("id").data(), who, sizeof(who));
        std::memcpy(draft->tensor("a").data(), a.data(), a.size());
        r = publisher.Commit(std::move(*draft), {});
      }
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      versions[w].push_back(r->version);
    }
  };
  std::thread t0(writer, 0), t1(writer, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(publisher.Wait().ok());
  for (const auto& v : versions) {
    ASSERT_EQ(v.size(), kRounds);
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
  }
  for (Consumer* c : {p.remote.get(), p.mapper.get()}) {
    auto last = c->sub->WaitFor(2 * kRounds, 60s);
    ASSERT_TRUE(last.ok()) << last.status().ToString() << "; " << c->sub->last_error().ToString();
    auto live = c->LiveUpTo(2 * kRounds);
    EXPECT_TRUE(std::is_sorted(live.begin(), live.end()) && std::adjacent_find(live.begin(), live.end()) == live.end())
        << "versions went live out of order: " << ::testing::PrintToString(live);
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(torn.empty()) << torn.size() << " versions not as one writer wrote them, first " << torn.front();
  EXPECT_EQ(p.publisher->node().stats().produced_early, 2 * kRounds);
}

// A relay forwards a version its upstream is still producing: its own consumer receives while the
// producer writes, gets the checksum and final header from the relay (which seals it when its own
// transfer is sealed), and the relay commits the producer's checksum. An abandoned version is
// committed nowhere.
TEST(CutThrough, RelayForwardsAVersionStillBeingProduced) {
  auto a = StartNode();
  auto b = StartNode();
  ASSERT_TRUE(a && b);
  RelayOptions ro;
  ro.upstream = a->address();
  ro.models = {"m"};
  ro.always_remote = true;
  auto relay = Relay::Start(*b, ro);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  Consumer consumer(*b);
  ASSERT_TRUE(consumer.sub);
  ASSERT_TRUE(WaitUntil([&] { return a->HasEarlyReaders("m") && b->HasEarlyReaders("m"); }, 30s));
  Version v1 = MakeVersion(16 << 20, 1, 31);
  {
    Producing p(*a, v1);
    ASSERT_TRUE(p.in);
    p.Write(v1.final.size() / 2);
    ASSERT_TRUE(WaitUntil([&] { return b->stats().bytes_sent_incoming >= 4u << 20; }, 30s))
        << "the relay did not forward the version while it was produced";
    EXPECT_EQ(consumer.sub->latest(), nullptr);
    p.Write(v1.final.size());
    ASSERT_TRUE(p.SealAndCommit().ok());
  }
  auto mv = consumer.sub->WaitFor(1, 30s);
  ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; " << consumer.sub->last_error().ToString();
  ExpectBitExact(**mv, v1);
  EXPECT_NE((*mv)->reason.find(kCutThrough), std::string::npos) << (*mv)->reason;
  ASSERT_TRUE(WaitUntil([&] { return b->Latest("m").has_value(); }, 30s));
  EXPECT_EQ(b->Latest("m")->checksum, v1.checksum);
  EXPECT_EQ(Settled([&] { return a->stats().bytes_sent; }, v1.final.size()), v1.final.size()) << "the producer's node sent one copy";

  Version v2 = MakeVersion(16 << 20, 2, 32);
  const uint64_t before = Settled([&] { return b->stats().bytes_sent_incoming; });
  const uint64_t failures = consumer.sub->stats().fetch_failures;
  ::testing::internal::CaptureStderr();
  {
    Producing p(*a, v2);
    ASSERT_TRUE(p.in);
    p.Write(v2.final.size() / 2);
    ASSERT_TRUE(WaitUntil([&] { return b->stats().bytes_sent_incoming >= before + (4u << 20); }, 30s))
        << "the relay did not forward version 2 while it was produced";
  }  // abandoned
  ASSERT_TRUE(WaitUntil([&] { return b->stats().incoming_aborted >= 1; }, 30s)) << "the relay kept the abandoned version";
  ASSERT_TRUE(WaitUntil([&] { return consumer.sub->stats().fetch_failures > failures; }, 30s))
      << "the consumer never gave the abandoned version up";
  std::this_thread::sleep_for(200ms);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(b->Latest("m")->version, 1u);
  EXPECT_EQ(consumer.Live(), std::vector<uint64_t>{1});
  // Asked for a delta of a version it does not have, a node refuses the FETCH itself: the same
  // request in full would get the same answer, so none is sent.
  EXPECT_EQ(said.find("fetching it in full"), std::string::npos) << said;
  relay->reset();
}

}  // namespace
}  // namespace viper
