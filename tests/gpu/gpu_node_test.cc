// The node's side of GPU-resident versions, on every machine (no GPU needed): FETCH in kDevice
// mode and the RELEASE / disconnect rules of its leases, the kDevice replica in NOTIFY, how the new
// fetch mode and replica kind parse and are refused, a consumer without a GPU that keeps the host
// path, and SubscriberOptions::gpu_device on a machine without a driver (VIPER_CUDA_LIBRARY points
// at nothing). The node talks real UCX on loopback and real shared memory; the device copy is a
// DeviceReplicaSource that counts leases and hands out a well-formed GPU version message (the
// GPU-backed one, GpuPublisher's, is exercised by gpu_test on a machine with a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "api/client.h"
#include "api/process.h"
#include "net/protocol.h"
#include "store/host_tier.h"
#include "viper/gpu_publisher.h"
#include "viper/gpu_store.h"
#include "viper/node.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::WaitUntil;

class CountingSource : public DeviceReplicaSource {
 public:
  int device() const override { return 0; }
  uint64_t live_version() const override { return live.load(); }
  Result<std::string> Lease(uint64_t version) override {
    if (version != 0 && version != live.load())
      return Status::NotFound("GPU: version " + std::to_string(version) + " is no longer on the device");
    gpu::GpuVersion v;
    v.version = live.load();
    v.total_bytes = 4096;
    v.data_offset = 256;
    v.data_bytes = 1024;
    v.buffer = 1;
    leases++;
    return gpu::EncodeGpuVersion(v);
  }
  void Release(const std::string& message) override {
    ASSERT_TRUE(gpu::ParseGpuVersion(std::as_bytes(std::span(message.data(), message.size()))).ok());
    leases--;
  }
  std::atomic<uint64_t> live{0};
  std::atomic<int> leases{0};
};

Result<uint64_t> PublishOne(Publisher& pub, uint8_t fill) {
  std::vector<std::byte> w(4096, std::byte{fill});
  VIPER_ASSIGN_OR_RETURN(PublishResult r, pub.Publish({{{"w", DType::kU8, {4096}}, w}}));
  VIPER_RETURN_IF_ERROR(pub.Wait());
  return r.version;
}

std::vector<std::byte> Frame(const proto::Message& m) { return proto::Encode(m); }

TEST(GpuProtocol, DeviceFetchModeAndReplicaKindRoundTrip) {
  proto::Fetch f{7, "m", 3, proto::FetchMode::kDevice, 0, 0};
  auto d = proto::Decode(Frame(f));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<proto::Fetch>(*d), f);
  proto::FetchOk ok{7, proto::FetchMode::kDevice, {}, std::string(128, 'x'), 0, 0, proto::Encoding::kFull, 0, ""};
  ok.info.model = "m";
  ok.info.replicas.push_back({proto::ReplicaKind::kDevice, "host", "cuda:0"});
  auto d2 = proto::Decode(Frame(ok));
  ASSERT_TRUE(d2.ok()) << d2.status().ToString();
  EXPECT_EQ(std::get<proto::FetchOk>(*d2), ok);
}

TEST(GpuProtocol, MalformedDeviceMessagesAreRefusedNamingTheField) {
  proto::FetchOk ok{7, proto::FetchMode::kDevice, {}, "short", 0, 0, proto::Encoding::kFull, 0, ""};
  auto d = proto::Decode(Frame(ok));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("segment: a kDevice FETCH_OK carries the 128-byte GPU version message, not 5 bytes"),
            std::string::npos) << d.status().message();
  // Fetch mode 4 and replica kind 6 are unknown.
  auto frame = Frame(proto::Fetch{7, "m", 3, proto::FetchMode::kDevice, 0, 0});
  const size_t mode_at = proto::kFrameHeaderBytes + 8 + 4 + 1 + 8;  // request_id, model "m", version
  ASSERT_EQ(frame[mode_at], std::byte{3});
  frame[mode_at] = std::byte{4};
  auto bad = proto::Decode(frame);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown fetch mode 4"), std::string::npos) << bad.status().message();
  proto::Notify n;
  n.info.model = "m";
  n.info.replicas.push_back({proto::ReplicaKind::kDevice, "h", "cuda:0"});
  auto nf = Frame(n);
  // The replica's kind byte: after the fixed VersionInfo fields and the two counts.
  const size_t kind_at = proto::kFrameHeaderBytes + 4 + 1 + 8 * 6 + 4 + 4;
  ASSERT_EQ(nf[kind_at], std::byte{5});
  nf[kind_at] = std::byte{6};
  auto bk = proto::Decode(nf);
  ASSERT_FALSE(bk.ok());
  EXPECT_NE(bk.status().message().find("unknown replica kind 6"), std::string::npos) << bk.status().message();
}

struct Fixture {
  std::unique_ptr<Publisher> pub;
  std::shared_ptr<CountingSource> source = std::make_shared<CountingSource>();
  Fixture() {
    PublisherOptions o;
    o.model = "gm";
    o.node.segment_prefix = "viper-gpu-node-test";
    auto p = Publisher::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    pub = std::move(p).value();
    pub->node().SetDeviceReplicas("gm", source);
  }
};

TEST(GpuNode, DeviceLeasesEndOnReleaseAndOnDisconnect) {
  Fixture f;
  auto v1 = PublishOne(*f.pub, 1);
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  f.source->live = *v1;
  ClientOptions co;
  co.connect = f.pub->address();
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto ok = (*c)->FetchDevice("gm", *v1);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->mode, proto::FetchMode::kDevice);
  EXPECT_EQ(ok->info.version, *v1);
  auto v = gpu::ParseGpuVersion(std::as_bytes(std::span(ok->segment.data(), ok->segment.size())));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->version, *v1);
  EXPECT_EQ(f.source->leases.load(), 1);
  // A host lease of the same version and a device lease: RELEASE ends the device lease first.
  auto host = (*c)->FetchLease("gm", *v1);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  (*c)->Release("gm", *v1);
  EXPECT_TRUE(WaitUntil([&] { return f.source->leases.load() == 0; }, 5s)) << "RELEASE did not end the device lease";
  (*c)->Release("gm", *v1);
  // A version no longer live on the device: NotFound, nothing leased.
  auto v2 = PublishOne(*f.pub, 2);
  ASSERT_TRUE(v2.ok());
  f.source->live = *v2;
  auto stale = (*c)->FetchDevice("gm", *v1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kNotFound) << stale.status().ToString();
  EXPECT_NE(stale.status().message().find("no longer on the device"), std::string::npos) << stale.status().message();
  // A model without a device copy.
  auto none = (*c)->FetchDevice("other", 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no GPU-resident copy"), std::string::npos) << none.status().message();
  // A consumer that goes away holding two device leases: both end with its connection.
  ASSERT_TRUE((*c)->FetchDevice("gm", 0).ok());
  ASSERT_TRUE((*c)->FetchDevice("gm", *v2).ok());
  EXPECT_EQ(f.source->leases.load(), 2);
  c->reset();
  EXPECT_TRUE(WaitUntil([&] { return f.source->leases.load() == 0; }, 10s))
      << "a disconnected consumer's device leases were kept: " << f.source->leases.load();
}

TEST(GpuNode, NotifyListsTheDeviceCopyAndACpuConsumerKeepsTheHostPath) {
  Fixture f;
  std::mutex mu;
  std::vector<proto::VersionInfo> notified;
  ClientOptions co;
  co.connect = f.pub->address();
  ClientHandlers h;
  h.on_notify = [&](const proto::VersionInfo& info) {
    std::lock_guard lock(mu);
    notified.push_back(info);
  };
  auto watcher = Client::Connect(co, h);
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE((*watcher)->Subscribe("gm").ok());
  SubscriberOptions so;
  so.model = "gm";
  so.connect = f.pub->address();
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  // The device copy is live at the version when it is committed (GpuPublisher: the device copy
  // completes before the host copy is sealed): the NOTIFY lists it.
  f.source->live = 1;
  auto v1 = PublishOne(*f.pub, 7);
  ASSERT_TRUE(v1.ok());
  ASSERT_EQ(*v1, 1u);
  auto got = (*sub)->WaitFor(1, 10s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)->device, nullptr) << "a consumer without gpu_device gets no device copy";
  EXPECT_TRUE((*got)->path == FetchPath::kMap || (*got)->path == FetchPath::kCopy) << (*got)->reason;
  EXPECT_EQ((*got)->snapshot.data_region()[0], std::byte{7});
  EXPECT_EQ(f.source->leases.load(), 0) << "a CPU consumer leased the device copy";
  ASSERT_TRUE(WaitUntil([&] { std::lock_guard lock(mu); return !notified.empty(); }, 5s));
  {
    std::lock_guard lock(mu);
    const auto& r = notified.back().replicas;
    auto dev = std::find_if(r.begin(), r.end(), [](const auto& x) { return x.kind == proto::ReplicaKind::kDevice; });
    ASSERT_NE(dev, r.end()) << "NOTIFY does not list the device copy";
    EXPECT_EQ(dev->locator, "cuda:0");
    EXPECT_EQ(dev->host_key, f.pub->node().host_key());
  }
  // Not live on the device at commit: not listed; and never in LIST (the catalog).
  auto v2 = PublishOne(*f.pub, 8);
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(WaitUntil([&] { std::lock_guard lock(mu); return notified.size() >= 2; }, 5s));
  {
    std::lock_guard lock(mu);
    for (const auto& r : notified.back().replicas) EXPECT_NE(r.kind, proto::ReplicaKind::kDevice);
  }
  auto listed = (*watcher)->List();
  ASSERT_TRUE(listed.ok());
  for (const auto& info : *listed)
    for (const auto& r : info.replicas) EXPECT_NE(r.kind, proto::ReplicaKind::kDevice) << "LIST lists a device copy";
}

// Commits `version` (reserved by the caller) on the node: what GpuPublisher does once the host copy
// is sealed.
Status CommitReserved(Node& node, const std::string& model, uint64_t version, uint8_t fill) {
  std::vector<std::byte> w(4096, std::byte{fill});
  VIPER_ASSIGN_OR_RETURN(Snapshot snap, BuildSnapshot({{{"w", DType::kU8, {4096}}, w}}, VersionStamp{model, version, 5, 0, 0, {}}));
  VIPER_ASSIGN_OR_RETURN(WriteLease lease, node.Allocate(snap.bytes().size()));
  std::memcpy(lease.data().data(), snap.bytes().data(), snap.bytes().size());
  proto::VersionInfo vi;
  vi.model = model;
  vi.version = version;
  vi.size = snap.bytes().size();
  vi.checksum = *snap.declared_checksum();
  vi.step = 5;
  return node.Commit(std::move(lease), std::move(vi)).status();
}

struct Watcher {
  std::mutex mu;
  std::vector<proto::VersionInfo> notified;
  std::unique_ptr<Client> client;
  Watcher(const std::string& address, uint8_t flags) {
    ClientOptions co;
    co.connect = address;
    ClientHandlers h;
    h.on_notify = [this](const proto::VersionInfo& info) {
      std::lock_guard lock(mu);
      notified.push_back(info);
    };
    auto c = Client::Connect(co, h);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return;
    client = std::move(c).value();
    EXPECT_TRUE(client->Subscribe("gm", flags).ok());
  }
  size_t count() {
    std::lock_guard lock(mu);
    return notified.size();
  }
  proto::VersionInfo at(size_t i) {
    std::lock_guard lock(mu);
    return notified.at(i);
  }
};

bool OnlyDeviceReplica(const proto::VersionInfo& info) {
  return info.replicas.size() == 1 && info.replicas[0].kind == proto::ReplicaKind::kDevice;
}

TEST(GpuNode, ADeviceOnlyNotifyGoesOnlyToDeviceSubscribersBeforeTheCommit) {
  // GpuPublisher's early announcement (Node::AnnounceDevice when the device copy completes), with
  // the device copy a counting source: the NOTIFY reaches the subscribers that asked
  // (kSubscribeDevice, same host), late joiners included, FETCH kDevice leases the version before
  // the host tier has it, and everyone else hears of the version only at its commit.
  Fixture f;
  Watcher device(f.pub->address(), proto::kSubscribeDevice), plain(f.pub->address(), 0);
  ASSERT_TRUE(device.client && plain.client);
  SubscriberOptions so;
  so.model = "gm";
  so.connect = f.pub->address();
  auto sub = Subscriber::Start(so);  // no GPU: the host path only
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto v = f.pub->node().ReserveVersion("gm");
  ASSERT_TRUE(v.ok());
  f.source->live = *v;
  proto::VersionInfo early;
  early.model = "gm";
  early.version = *v;
  early.size = 8192;
  early.checksum = 1234;  // not known yet: the node sends 0
  early.step = 5;
  early.publish_ns = 42;
  f.pub->node().AnnounceDevice(early);
  ASSERT_TRUE(WaitUntil([&] { return device.count() == 1; }, 5s)) << "no device-only NOTIFY";
  proto::VersionInfo got = device.at(0);
  EXPECT_EQ(got.version, *v);
  EXPECT_EQ(got.checksum, 0u);
  EXPECT_EQ(got.size, 8192u);
  EXPECT_EQ(got.publish_ns, 42);
  ASSERT_TRUE(OnlyDeviceReplica(got)) << "a device-only NOTIFY lists only the device copy";
  EXPECT_EQ(got.replicas[0].locator, "cuda:0");
  EXPECT_EQ(got.replicas[0].host_key, f.pub->node().host_key());
  // A late joiner that asks for device NOTIFYs gets it at once.
  Watcher late(f.pub->address(), proto::kSubscribeDevice);
  ASSERT_TRUE(WaitUntil([&] { return late.count() == 1; }, 5s)) << "a late device subscriber got nothing";
  EXPECT_TRUE(OnlyDeviceReplica(late.at(0)));
  // Leased before the host tier has it, released as usual.
  auto ok = device.client->FetchDevice("gm", *v);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->info.version, *v);
  EXPECT_EQ(ok->info.checksum, 0u);
  EXPECT_EQ(f.source->leases.load(), 1);
  device.client->Release("gm", *v);
  EXPECT_TRUE(WaitUntil([&] { return f.source->leases.load() == 0; }, 5s));
  // Once the device holds another version, the announced one is no longer served.
  f.source->live = 0;
  auto gone = device.client->FetchDevice("gm", *v);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
  f.source->live = *v;
  // The host commit: every subscriber gets the usual NOTIFY; the first the plain one gets.
  ASSERT_TRUE(CommitReserved(f.pub->node(), "gm", *v, 9).ok());
  ASSERT_TRUE(WaitUntil([&] { return device.count() == 2 && plain.count() >= 1; }, 5s));
  EXPECT_FALSE(OnlyDeviceReplica(plain.at(0)));
  EXPECT_EQ(plain.at(0).version, *v);
  EXPECT_NE(plain.at(0).checksum, 0u);
  EXPECT_EQ(device.at(1).version, *v);
  EXPECT_NE(device.at(1).checksum, 0u);
  auto loaded = (*sub)->WaitFor(*v, 10s);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->snapshot.data_region()[0], std::byte{9});
  EXPECT_EQ(f.source->leases.load(), 0) << "a CPU consumer leased the device copy";
  // A version not above the latest is not announced again; the next one is.
  f.pub->node().AnnounceDevice(early);
  auto v2 = f.pub->node().ReserveVersion("gm");
  ASSERT_TRUE(v2.ok());
  f.source->live = *v2;
  early.version = *v2;
  f.pub->node().AnnounceDevice(early);
  ASSERT_TRUE(WaitUntil([&] { return device.count() == 3; }, 5s));
  EXPECT_EQ(device.at(2).version, *v2) << "a stale version was announced";
  EXPECT_EQ(plain.count(), 1u) << "a subscriber without kSubscribeDevice got a device-only NOTIFY";
}

TEST(GpuNode, GpuDeviceWithoutAGpuIsRefusedClearly) {
  Fixture f;
  SubscriberOptions so;
  so.model = "gm";
  so.connect = f.pub->address();
  so.gpu_device = 0;
  auto sub = Subscriber::Start(so);
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.status().code(), StatusCode::kUnavailable) << sub.status().ToString();
  EXPECT_NE(sub.status().message().find("SubscriberOptions::gpu_device 0: GPU: "), std::string::npos)
      << sub.status().message();
  so.gpu_device = -2;
  sub = Subscriber::Start(so);
  ASSERT_FALSE(sub.ok());
  EXPECT_NE(sub.status().message().find("gpu_device -2: must be -1 (no GPU) or a CUDA device ordinal >= 0"),
            std::string::npos) << sub.status().message();
  so.gpu_device = -1;
  so.gpu_in_place = true;
  sub = Subscriber::Start(so);
  ASSERT_FALSE(sub.ok());
  EXPECT_NE(sub.status().message().find("gpu_in_place needs gpu_device >= 0"), std::string::npos) << sub.status().message();
  so.gpu_in_place = false;
  so.gpu_early = true;
  sub = Subscriber::Start(so);
  ASSERT_FALSE(sub.ok());
  EXPECT_NE(sub.status().message().find("gpu_early needs gpu_device >= 0"), std::string::npos) << sub.status().message();
}

TEST(GpuNode, ZeroCopyGpuPublishWithoutAGpuIsUnavailableNamingTheDriver) {
  // GpuPublisher::BeginDevice needs a started GpuPublisher: without a driver neither it nor its
  // store starts, and the error names what is missing (VIPER_CUDA_LIBRARY points at nothing).
  Fixture f;
  auto gp = GpuPublisher::Start(f.pub.get());
  ASSERT_FALSE(gp.ok());
  EXPECT_EQ(gp.status().code(), StatusCode::kUnavailable) << gp.status().ToString();
  EXPECT_NE(gp.status().message().find("GPU: /nonexistent/libcuda.so.1 not found"), std::string::npos)
      << gp.status().message();
  auto store = gpu::DeviceVersionStore::Create({});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
  // A draft that holds no buffer is inert: no tensors, nothing to abandon.
  gpu::DeviceDraft empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_TRUE(empty.tensors().empty());
  EXPECT_EQ(empty.tensor("w"), 0u);
  gpu::DeviceDraft moved(std::move(empty));
  EXPECT_FALSE(moved.valid());
}

}  // namespace
}  // namespace viper
