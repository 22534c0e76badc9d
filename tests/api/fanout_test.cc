// Fan-out (issue 14) inside one process: a version arriving at a node (Node::Receive) is forwarded
// chunk by chunk as it lands, aborted transfers end cleanly for their receivers, and a chain of
// relays costs each node one copy of egress per update. Real nodes, real UCX over loopback.
// The cross-host versions (real processes in network namespaces) are in tests/xnode.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>

#include "api/client.h"
#include "process.h"
#include "store/host_tier.h"
#include "viper/delta.h"
#include "viper/node.h"
#include "viper/relay.h"
#include "viper/snapshot.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using testing::Settled;
using testing::WaitUntil;
using namespace std::chrono_literals;

constexpr uint64_t kChunk = 1 << 20;

// A sealed snapshot of about `bytes` bytes whose content depends on `seed`.
Snapshot MakeSnapshot(uint64_t bytes, uint64_t version, uint32_t seed) {
  std::vector<std::byte> data(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : data) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  VersionStamp stamp;
  stamp.model = "m";
  stamp.version = version;
  auto snap = BuildSnapshot({{{"w", DType::kU8, {static_cast<int64_t>(bytes)}}, data}}, stamp);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return std::move(snap).value();
}

proto::VersionInfo InfoOf(const Snapshot& snap, uint64_t version) {
  proto::VersionInfo info;
  info.model = "m";
  info.version = version;
  info.size = snap.bytes().size();
  info.checksum = snap.compute_checksum();
  return info;
}

std::unique_ptr<Node> StartNode() {
  auto node = Node::Start(NodeOptions{});
  EXPECT_TRUE(node.ok()) << node.status().ToString();
  return node.ok() ? std::move(node).value() : nullptr;
}

std::unique_ptr<Client> Connect(const Node& node) {
  ClientOptions options;
  options.connect = node.address();
  options.chunk_bytes = kChunk;
  options.timeout = 30s;
  auto c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A relay of model "m" on `node`, fetching over UCX although its upstream is on this host.
std::unique_ptr<Relay> StartRelay(Node& node, const Node& upstream, std::vector<std::string> alternates = {}) {
  RelayOptions ro;
  ro.upstream = upstream.address();
  ro.alternates = std::move(alternates);
  ro.models = {"m"};
  ro.always_remote = true;
  auto relay = Relay::Start(node, ro);
  EXPECT_TRUE(relay.ok()) << relay.status().ToString();
  return relay.ok() ? std::move(relay).value() : nullptr;
}

// `snap` becomes version `version` of "m" on `node` (as a producer's publish would make it).
void CommitSnapshot(Node& node, const Snapshot& snap, uint64_t version) {
  auto lease = node.Allocate(snap.bytes().size());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::memcpy(lease->data().data(), snap.bytes().data(), snap.bytes().size());
  auto committed = node.Commit(std::move(lease).value(), InfoOf(snap, version));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
}

// A FETCH (SEND) running on its own thread, recording how far its prefix got.
struct Fetcher {
  std::vector<std::byte> buffer;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t prefix = 0;
  std::optional<uint64_t> checksum;
  std::future<Result<proto::FetchOk>> result;

  void Start(Client& client, uint64_t version) {
    result = std::async(std::launch::async, [this, &client, version] {
      return client.FetchSend(
          "m", version,
          [this](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
            buffer.resize(info.size);
            return std::span<std::byte>(buffer);
          },
          [this](uint64_t done, uint64_t) {
            std::lock_guard<std::mutex> lock(mu);
            prefix = done;
            cv.notify_all();
          },
          &checksum);
    });
  }
  bool WaitPrefix(uint64_t at_least) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 30s, [&] { return prefix >= at_least; });
  }
};

void Land(IncomingVersion& in, const Snapshot& snap, uint64_t from, uint64_t to) {
  std::memcpy(in.data().data() + from, snap.bytes().data() + from, to - from);
  in.Landed(to);
}

// A receiver gets the first half of a version while the node still waits for the second half:
// forwarding happens as bytes land, and the version completes bit-exact once the rest lands.
// Consumers of the node see nothing of it until it is committed.
TEST(Fanout, PeersReceiveChunksAsTheyLand) {
  auto node = StartNode();
  auto client = Connect(*node);
  ASSERT_TRUE(node && client);
  Snapshot snap = MakeSnapshot(16 << 20, 1, 1);
  const uint64_t size = snap.bytes().size(), half = 8 * kChunk;
  auto in = node->Receive(InfoOf(snap, 1));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  Land(**in, snap, 0, half);

  Fetcher fetch;
  fetch.Start(*client, 1);
  ASSERT_TRUE(fetch.WaitPrefix(half)) << "the receiver never got the landed half";
  EXPECT_EQ(fetch.result.wait_for(0s), std::future_status::timeout) << "the transfer ended before the version was complete";
  EXPECT_TRUE(WaitUntil([&] { return node->stats().bytes_sent_incoming >= half; }, 10s))
      << node->stats().bytes_sent_incoming << " bytes sent early";
  EXPECT_FALSE(node->Latest("m").has_value()) << "an incoming version must not be in the catalog";
  auto lease = client->FetchLease("m", 1);
  EXPECT_EQ(lease.status().code(), StatusCode::kNotFound) << "an incoming version must not be leased";

  Land(**in, snap, half, size);
  auto committed = (*in)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  auto ok = fetch.result.get();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(fetch.buffer.size(), size);
  EXPECT_TRUE(std::memcmp(fetch.buffer.data(), snap.bytes().data(), size) == 0);
  ASSERT_TRUE(fetch.checksum.has_value());
  EXPECT_EQ(*fetch.checksum, snap.compute_checksum());
  ASSERT_TRUE(node->Latest("m").has_value());
  EXPECT_EQ(node->Latest("m")->version, 1u);
  EXPECT_EQ(Settled([&] { return node->stats().bytes_sent; }, size), size);
  NodeStats st = node->stats();
  EXPECT_EQ(st.incoming_versions, 1u);
  EXPECT_EQ(st.incoming_aborted, 0u);
  in->reset();
}

// An incoming version dropped before Commit (its own transfer broke): a peer receiving it gets
// ERROR Aborted at once instead of waiting for its timeout, and the version never appears.
TEST(Fanout, AbortedIncomingEndsItsReceivers) {
  auto node = StartNode();
  auto client = Connect(*node);
  ASSERT_TRUE(node && client);
  Snapshot snap = MakeSnapshot(8 << 20, 3, 2);
  auto in = node->Receive(InfoOf(snap, 3));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  Land(**in, snap, 0, 2 * kChunk);
  Fetcher fetch;
  fetch.Start(*client, 3);
  ASSERT_TRUE(fetch.WaitPrefix(2 * kChunk));
  auto start = std::chrono::steady_clock::now();
  in->reset();
  auto ok = fetch.result.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the receiver waited for a timeout";
  ASSERT_FALSE(ok.ok());
  EXPECT_EQ(ok.status().code(), StatusCode::kUnavailable) << ok.status().ToString();
  EXPECT_NE(ok.status().message().find("aborted"), std::string::npos) << ok.status().ToString();
  EXPECT_EQ(node->stats().incoming_aborted, 1u);
  EXPECT_FALSE(node->Latest("m").has_value());
  auto other = Connect(*node);
  Fetcher again;
  again.Start(*other, 3);
  EXPECT_EQ(again.result.get().status().code(), StatusCode::kNotFound);
}

// A relay downstream of a node whose incoming version aborts mid-transfer falls back to the other
// node its INCOMING named (here the producer's node A) and still commits a whole, verified model,
// resuming at the prefix that landed from B.
TEST(Fanout, RelayFallsBackWhenItsUpstreamAborts) {
  auto a = StartNode();
  auto b = StartNode();
  auto c = StartNode();
  ASSERT_TRUE(a && b && c);
  Snapshot snap = MakeSnapshot(12 << 20, 1, 3);
  CommitSnapshot(*a, snap, 1);  // A holds version 1 complete
  auto relay = StartRelay(*c, *b);
  ASSERT_TRUE(relay);
  // B receives version 1 (as if from A): C is told at once and receives what lands.
  auto in = b->Receive(*a->Latest("m"));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  Land(**in, snap, 0, 4 * kChunk);
  ASSERT_TRUE(WaitUntil([&] { return b->stats().bytes_sent_incoming >= 4 * kChunk; }, 30s))
      << "C never fetched the incoming version from B";
  in->reset();  // B's own transfer broke
  ASSERT_TRUE(WaitUntil([&] { return c->Latest("m").has_value(); }, 30s)) << "C never got version 1";
  auto lease = c->host_tier().Acquire("m", 1);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->data().size(), snap.bytes().size());
  EXPECT_TRUE(std::memcmp(lease->data().data(), snap.bytes().data(), snap.bytes().size()) == 0);
  // C resumed at the 4 chunks that had landed from B (FETCH with an offset): A sent only the rest.
  const uint64_t rest = snap.bytes().size() - 4 * kChunk;
  EXPECT_EQ(Settled([&] { return a->stats().bytes_sent; }, rest), rest) << "C's fallback did not resume from its prefix";
  EXPECT_EQ(c->stats().incoming_aborted, 0u) << "C's own incoming version broke with B's";
  EXPECT_EQ(relay->stats().versions_relayed, 1u);
  relay.reset();
}

// A chain A -> B -> C -> D of relays: every node sends each version exactly once (to the next),
// whatever the number of consumers behind it; consumers on every node get every version bit-exact.
TEST(Fanout, ChainCostsEachNodeOneCopyPerUpdate) {
  auto a = StartNode();
  ASSERT_TRUE(a);
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<Relay>> relays;
  const Node* upstream = a.get();
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(StartNode());
    ASSERT_TRUE(nodes.back());
    relays.push_back(StartRelay(*nodes.back(), *upstream));
    ASSERT_TRUE(relays.back());
    upstream = nodes.back().get();
  }
  // Two consumers map the last relay's segments; one more on B.
  std::vector<std::unique_ptr<Subscriber>> consumers;
  for (const Node* n : {nodes[2].get(), nodes[2].get(), nodes[0].get()}) {
    SubscriberOptions so;
    so.model = "m";
    so.connect = n->address();
    so.path = FetchPath::kMap;
    so.verify_local = true;
    auto sub = Subscriber::Start(so);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    consumers.push_back(std::move(sub).value());
  }
  uint64_t total = 0;
  for (uint64_t v = 1; v <= 3; ++v) {
    Snapshot snap = MakeSnapshot(10 << 20, v, static_cast<uint32_t>(10 + v));
    CommitSnapshot(*a, snap, v);
    total += snap.bytes().size();
    for (auto& sub : consumers) {
      auto mv = sub->WaitFor(v, 60s);
      ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; last error: " << sub->last_error().ToString();
      EXPECT_EQ((*mv)->version(), v);
      EXPECT_EQ((*mv)->path, FetchPath::kMap);
      ASSERT_EQ((*mv)->snapshot.bytes().size(), snap.bytes().size());
      EXPECT_TRUE(std::memcmp((*mv)->snapshot.bytes().data(), snap.bytes().data(), snap.bytes().size()) == 0);
    }
  }
  EXPECT_EQ(Settled([&] { return a->stats().bytes_sent; }, total), total) << "the producer's node sent more than one copy per update";
  EXPECT_EQ(Settled([&] { return nodes[0]->stats().bytes_sent; }, total), total);
  EXPECT_EQ(Settled([&] { return nodes[1]->stats().bytes_sent; }, total), total);
  EXPECT_EQ(nodes[2]->stats().bytes_sent, 0u) << "its consumers map its segments";
  // A relay counts a version once it committed it, which may be after the next relay (receiving it
  // as it lands) committed it and served its consumers.
  for (auto& r : relays)
    EXPECT_TRUE(WaitUntil([&] { return r->stats().versions_received_in_place == 3; }, 30s))
        << r->stats().versions_received_in_place;
  // Each relay says which node it relays from; a configured one never joins a registry's tree.
  for (size_t i = 0; i < relays.size(); ++i) {
    RelayStats stats = relays[i]->stats();
    EXPECT_EQ(stats.connected_to["m"], i == 0 ? a->address() : nodes[i - 1]->address());
    EXPECT_EQ(stats.joins, 0u);
  }
  consumers.clear();
  relays.clear();
}

// `base` with one byte in 256 of its tensor changed, as version `version`: a delta of a few percent.
Snapshot Perturbed(const Snapshot& base, uint64_t version) {
  auto w = base.tensor_data(base.tensors().at(0));
  std::vector<std::byte> data(w.begin(), w.end());
  uint32_t x = 7;
  for (size_t i = 0; i < data.size(); i += 256) {
    x = x * 1664525u + 1013904223u;
    data[i] ^= static_cast<std::byte>((x >> 24) | 1);
  }
  VersionStamp stamp;
  stamp.model = "m";
  stamp.version = version;
  auto snap = BuildSnapshot({{{"w", DType::kU8, {static_cast<int64_t>(data.size())}}, data}}, stamp);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return std::move(snap).value();
}

// Deltas through the tree: a relay that receives a version as a delta answers a downstream relay
// that holds the base with a delta as well (once the version is complete here), instead of the
// full bytes as they land; a consumer behind the last relay gets the delta too.
TEST(Fanout, DeltasFlowThroughAChain) {
  NodeOptions no;
  no.delta = DeltaMode::kAlways;
  std::vector<std::unique_ptr<Node>> nodes;  // a -> b -> c
  for (int i = 0; i < 3; ++i) {
    auto n = Node::Start(no);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    nodes.push_back(std::move(n).value());
  }
  Node &a = *nodes[0], &b = *nodes[1], &c = *nodes[2];
  auto rb = StartRelay(b, a);
  auto rc = StartRelay(c, b);
  ASSERT_TRUE(rb && rc);
  SubscriberOptions so;
  so.model = "m";
  so.connect = c.address();
  so.path = FetchPath::kRemote;
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  Snapshot v1 = MakeSnapshot(8 << 20, 1, 21);
  CommitSnapshot(a, v1, 1);
  auto first = (*sub)->WaitFor(1, 60s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const Snapshot v2 = Perturbed(v1, 2);
  const uint64_t size = v2.bytes().size();
  const uint64_t b_full = Settled([&] { return b.stats().bytes_sent; });
  const uint64_t c_full = Settled([&] { return c.stats().bytes_sent; });
  CommitSnapshot(a, v2, 2);
  auto mv = (*sub)->WaitFor(2, 60s);
  ASSERT_TRUE(mv.ok()) << mv.status().ToString() << "; last error: " << (*sub)->last_error().ToString();
  ASSERT_EQ((*mv)->snapshot.bytes().size(), size);
  EXPECT_TRUE(std::memcmp((*mv)->snapshot.bytes().data(), v2.bytes().data(), size) == 0);
  EXPECT_EQ((*mv)->delta_base, 1u) << (*mv)->reason;
  Settled([&] { return b.stats().bytes_sent + c.stats().bytes_sent; });
  // A relay counts a delta passed on once its last part is in, which may be after the peer has
  // the whole stream: wait for the counts rather than read them at once.
  EXPECT_TRUE(WaitUntil([&] { return b.stats().delta.forwarded == 1 && c.stats().delta.forwarded == 1; }, 30s));
  NodeStats bs = b.stats(), cs = c.stats();
  std::printf("v2 of %llu bytes: the consumer received %llu bytes; b and c sent %llu and %llu delta bytes\n",
              static_cast<unsigned long long>(size), static_cast<unsigned long long>((*mv)->wire_bytes),
              static_cast<unsigned long long>(bs.delta.sent_bytes), static_cast<unsigned long long>(cs.delta.sent_bytes));
  EXPECT_LT((*mv)->wire_bytes, size / 10) << "the last hop carried more than a delta";
  // bytes_sent counts every version byte sent, the delta streams' included.
  EXPECT_LT(bs.bytes_sent - b_full, size / 10) << "relay b sent c the full version while it was still receiving the delta";
  EXPECT_LT(cs.bytes_sent - c_full, size / 10) << "relay c sent the consumer the full version";
  EXPECT_GE(bs.delta.sent, 1u);
  EXPECT_GE(cs.delta.sent, 1u);
  EXPECT_LT(bs.delta.sent_bytes, size / 10);
  // Each relay passed on the delta it received (no encode of its own).
  EXPECT_EQ(bs.delta.forwarded, 1u);
  EXPECT_EQ(cs.delta.forwarded, 1u);
  EXPECT_EQ(bs.delta.encoded, 0u) << "relay b encoded a delta of its own";
  EXPECT_EQ(cs.delta.encoded, 0u) << "relay c encoded a delta of its own";
  EXPECT_EQ(bs.delta.forwarded_bytes, cs.delta.forwarded_bytes);
  sub->reset();  // before the relays and nodes it talks to
  rc.reset();
  rb.reset();
}

// The delta stream of base -> target in parts of one 1 MiB block each (as an upstream sends it).
std::vector<std::shared_ptr<const std::vector<std::byte>>> DeltaParts(const Snapshot& base, const Snapshot& target) {
  DeltaOptions options;
  options.block_bytes = 1u << 20;
  auto enc = DeltaEncoder::Make(base, base.compute_checksum(), target, target.compute_checksum(), options);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  std::vector<std::shared_ptr<const std::vector<std::byte>>> parts;
  if (!enc.ok()) return parts;
  DeltaScratch scratch;
  for (size_t i = 0; i < enc->blocks(); ++i) {
    auto part = std::make_shared<std::vector<std::byte>>();
    if (i == 0) enc->AppendHeader(part.get());
    enc->EncodeBlock(i, scratch, part.get());
    parts.push_back(std::move(part));
  }
  return parts;
}

// A delta fetch of version 2 offering version 1 (`base`) as its base, on its own thread.
std::future<Result<DeltaFetch>> FetchWithBase(Client& client, const Snapshot& base, std::vector<std::byte>* buffer) {
  return std::async(std::launch::async, [&client, &base, buffer] {
    DeltaBase offered{1, base.compute_checksum(), base.bytes()};
    return client.FetchSendWithBase("m", 2, offered, [buffer](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
      buffer->resize(info.size);
      return std::span<std::byte>(*buffer);
    });
  });
}

// A relay's node (deltas always) holding version 1, a client of it, and the delta stream of
// version 2 against version 1 in parts, as the relay's upstream would send them.
class DeltaPassOn : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeOptions no;
    no.delta = DeltaMode::kAlways;
    auto started = Node::Start(no);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    node = std::move(started).value();
    client = Connect(*node);
    ASSERT_TRUE(client);
    CommitSnapshot(*node, v1, 1);
    parts = DeltaParts(v1, v2);
    ASSERT_GE(parts.size(), 8u);
  }
  void TearDown() override { client.reset(); }

  // Version 2 arriving at the relay as a delta against version 1.
  std::unique_ptr<IncomingVersion> Receive() {
    auto in = node->Receive(InfoOf(v2, 2), /*by_delta=*/true);
    EXPECT_TRUE(in.ok()) << in.status().ToString();
    return in.ok() ? std::move(in).value() : nullptr;
  }
  // Version 2 arriving, a peer's fetch offering version 1 (*fetch), and parts [0, n) passed on to
  // it; null if the fetch was not answered with them.
  std::unique_ptr<IncomingVersion> PassOnFirstParts(size_t n, std::future<Result<DeltaFetch>>* fetch) {
    auto in = Receive();
    if (!in) return nullptr;
    *fetch = FetchWithBase(*client, v1, &received);
    PassOn(*in, 0, n);
    if (!WaitUntil([&] { return node->stats().delta.sent == 1; }, 30s)) {
      ADD_FAILURE() << "the peer's fetch was not passed on";
      return nullptr;
    }
    return in;
  }
  // Passes parts [from, to) on, the final part of the stream marked last.
  void PassOn(IncomingVersion& in, size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      in.ForwardDeltaPart(1, base_checksum, static_cast<uint32_t>(i), parts[i], i + 1 == parts.size());
  }
  // Waits for a fetch of FetchWithBase; its result.
  static Result<DeltaFetch> Wait(std::future<Result<DeltaFetch>>& fetch) {
    if (fetch.wait_for(30s) != std::future_status::ready) return Status::Timeout("the peer's fetch still waits");
    return fetch.get();
  }

  Snapshot v1 = MakeSnapshot(8 << 20, 1, 31), v2 = Perturbed(v1, 2);
  const uint64_t base_checksum = v1.compute_checksum();
  std::unique_ptr<Node> node;
  std::unique_ptr<Client> client;
  std::vector<std::shared_ptr<const std::vector<std::byte>>> parts;
  std::vector<std::byte> received;
};

// A relay receiving version 2 as a delta against version 1 passes the delta's parts on to a peer
// that offers version 1 as they arrive: the peer decodes the whole version, bit-exact, before the
// relay has decoded a byte of it or committed it, and the relay encodes nothing.
TEST_F(DeltaPassOn, APeerGetsTheDeltaBeforeTheRelayHasTheVersion) {
  auto in = Receive();
  ASSERT_TRUE(in);
  auto fetch = FetchWithBase(*client, v1, &received);  // parked until the first part, or passed on
  PassOn(*in, 0, parts.size());
  auto got = Wait(fetch);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->ok.encoding, proto::Encoding::kDelta);
  EXPECT_NE(got->ok.detail.find("passed on"), std::string::npos) << got->ok.detail;
  ASSERT_EQ(received.size(), v2.bytes().size());
  EXPECT_TRUE(std::memcmp(received.data(), v2.bytes().data(), received.size()) == 0);
  EXPECT_EQ(got->data_checksum, v2.compute_checksum());
  DeltaStats stats = node->stats().delta;
  EXPECT_EQ(stats.forwarded, 1u);
  EXPECT_EQ(stats.encoded, 0u);
  EXPECT_EQ(stats.sent, 1u);
  // The relay then decodes, verifies and commits it as usual.
  Land(*in, v2, 0, v2.bytes().size());
  ASSERT_TRUE(in->Commit().ok());
  EXPECT_EQ(node->Latest("m")->version, 2u);
}

// The upstream's delta breaks off at the relay after a peer started receiving it: the peer's fetch
// fails at once (no hang, nothing decoded passes for the version), and a new transfer of the same
// version is passed on afresh.
TEST_F(DeltaPassOn, ADeltaThatBreaksOffFailsItsPeersAndCanStartAgain) {
  std::future<Result<DeltaFetch>> fetch;
  auto in = PassOnFirstParts(3, &fetch);
  ASSERT_TRUE(in);
  in.reset();  // the transfer into the relay broke off
  auto got = Wait(fetch);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_EQ(node->stats().delta.cancelled, 1u);
  EXPECT_EQ(node->stats().incoming_aborted, 1u);

  in = Receive();
  ASSERT_TRUE(in);
  auto again = FetchWithBase(*client, v1, &received);
  PassOn(*in, 0, parts.size());
  auto second = Wait(again);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(received.size(), v2.bytes().size());
  EXPECT_TRUE(std::memcmp(received.data(), v2.bytes().data(), received.size()) == 0);
  EXPECT_EQ(node->stats().delta.forwarded, 1u);
}

// A part that arrives out of order stops the passing on (the peer's fetch fails; the stream is not
// resumed with a gap), and the version, once committed, is encoded here for the next peer.
TEST_F(DeltaPassOn, APartOutOfOrderStopsThePassingOn) {
  std::future<Result<DeltaFetch>> fetch;
  auto in = PassOnFirstParts(1, &fetch);
  ASSERT_TRUE(in);
  PassOn(*in, 2, parts.size());  // part 1 skipped
  auto got = Wait(fetch);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_NE(got.status().message().find("out of order"), std::string::npos) << got.status().ToString();
  EXPECT_EQ(node->stats().delta.forwarded, 0u);
  Land(*in, v2, 0, v2.bytes().size());
  ASSERT_TRUE(in->Commit().ok());
  auto again = FetchWithBase(*client, v1, &received);
  auto second = Wait(again);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->ok.encoding, proto::Encoding::kDelta);
  EXPECT_EQ(second->ok.detail.find("passed on"), std::string::npos) << second->ok.detail;
  EXPECT_TRUE(std::memcmp(received.data(), v2.bytes().data(), v2.bytes().size()) == 0);
  // The encode is counted when its workers finish, which may be after the peer has the last part.
  EXPECT_TRUE(WaitUntil([&] { return node->stats().delta.encoded == 1; }, 30s)) << node->stats().delta.encoded;
}

// A delta stream that grows past the version's own size is not passed on (nor held): the peer's
// fetch fails at once, naming why.
TEST_F(DeltaPassOn, AStreamLargerThanTheVersionIsNotPassedOn) {
  std::future<Result<DeltaFetch>> fetch;
  auto in = PassOnFirstParts(1, &fetch);
  ASSERT_TRUE(in);
  in->ForwardDeltaPart(1, base_checksum, 1, std::make_shared<const std::vector<std::byte>>(v2.bytes().size()), false);
  auto got = Wait(fetch);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_NE(got.status().message().find("grew past the version"), std::string::npos) << got.status().ToString();
  EXPECT_EQ(node->stats().delta.forwarded, 0u);
}

// A relay whose upstream relay goes away re-attaches to its alternate (here the producer's node)
// and keeps relaying the versions that follow; when its upstream is back (on the same address) it
// returns to it (the probe runs on the subscriber's prober thread: under TSan in CI).
TEST(Fanout, RelayReattachesPastALostUpstream) {
  auto a = StartNode();
  auto b = StartNode();
  auto c = StartNode();
  ASSERT_TRUE(a && b && c);
  auto publish = [&](uint64_t v) { CommitSnapshot(*a, MakeSnapshot(4 << 20, v, static_cast<uint32_t>(20 + v)), v); };
  auto relay_b = StartRelay(*b, *a);
  auto relay_c = StartRelay(*c, *b, {a->address()});
  ASSERT_TRUE(relay_b && relay_c);
  publish(1);
  ASSERT_TRUE(WaitUntil([&] { return c->Latest("m").has_value(); }, 30s)) << "version 1 never reached C";
  const uint64_t v1_size = a->Latest("m")->size;
  EXPECT_EQ(Settled([&] { return a->stats().bytes_sent; }, v1_size), v1_size) << "C took version 1 from B, not from A";
  const std::string b_address = b->address();
  relay_b.reset();  // B goes away
  b.reset();
  publish(2);
  ASSERT_TRUE(WaitUntil([&] { auto l = c->Latest("m"); return l && l->version == 2; }, 30s))
      << "C did not re-attach to A";
  EXPECT_EQ(relay_c->stats().versions_relayed, 2u);

  NodeOptions again;
  again.listen = b_address;
  std::unique_ptr<Node> b2;
  ASSERT_TRUE(WaitUntil([&] {  // the port may take a moment to be free again
    auto started = Node::Start(again);
    if (started.ok()) b2 = std::move(started).value();
    return b2 != nullptr;
  }, 20s));
  relay_b = StartRelay(*b2, *a);
  ASSERT_TRUE(relay_b);
  ASSERT_TRUE(WaitUntil([&] { return c->stats().upstream.preferred_returns == 1; }, 30s))
      << "C stayed on its alternate";
  publish(3);
  ASSERT_TRUE(WaitUntil([&] { auto l = c->Latest("m"); return l && l->version == 3; }, 30s));
  EXPECT_EQ(c->stats().upstream.on_preferred, 1u);
  relay_c.reset();
  relay_b.reset();  // before b2, which it relays into
}

}  // namespace
}  // namespace viper
