// The fault suite: kill -9 of any process of a small deployment at random points, then the checks
// of tests/fault/cluster.h after every restart. docs/RELIABILITY.md records the figures.
//
//   VIPER_FAULT_ROUNDS=N   rounds of the kill test (default 50; scripts/soak.sh runs more)
//   VIPER_FAULT_SEED=S     replays a run: every random choice follows from the seed it prints
//
// Half the rounds (async publishes) run a registry-backed deployment when Redis is built in: the
// producer's node and the relay register in a real redis-server, which is one more member the
// rounds kill with -9 (docs/RELIABILITY.md, "Redis").
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "fault/cluster.h"
#include "fault/content.h"
#include "store/file_tier.h"
#include "store/host_tier.h"
#include "viper/node.h"
#include "viper/snapshot.h"
#ifdef VIPER_FAULT_REDIS
#include "fleet.h"  // tests/registry: RedisServer, HeldBy, RegisteredFor
#endif

namespace viper::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A failure's message: the reason, the members' logs, and the reason once more at the end (an
// excerpt of a long CI output keeps only its head and its tail).
std::string Failure(const std::string& reason, const std::string& details) {
  return reason + "\n" + details + "\n(the failure, again) " + reason;
}

// Kills a randomly chosen member after a random delay, restarts it, and checks everything.
void RunRounds(FaultCluster& cluster, uint64_t seed, uint64_t rounds, const char* label) {
  std::mt19937_64 rng(seed);
  auto victims = cluster.victims();
  ASSERT_FALSE(victims.empty());
  std::map<std::string, int> kills;
  for (uint64_t round = 1; round <= rounds; ++round) {
    Member* victim = victims[rng() % victims.size()];
    // Half the kills come right after an announce (the version may not be on the file tier yet),
    // the others after a random delay.
    const bool after_announce = rng() % 2 == 0;
    auto delay = std::chrono::milliseconds(after_announce ? rng() % 3 : rng() % 400);
    auto down = std::chrono::milliseconds(rng() % 100);
    if (after_announce) (void)cluster.WaitForAnnounce(10s);
    std::this_thread::sleep_for(delay);
    victim->Kill();
    std::this_thread::sleep_for(down);
    Status started = victim->Start();
    ASSERT_TRUE(started.ok()) << Failure(fmt::format("{} seed {} round {}: restarting {}: {}", label, seed, round,
                                                     victim->name(), started.ToString()),
                                         cluster.Logs());
    Status progress = cluster.WaitForProgress(60s);
    ASSERT_TRUE(progress.ok()) << Failure(fmt::format("{} seed {} round {} (killed {}): {}", label, seed, round,
                                                      victim->name(), progress.ToString()),
                                          cluster.Logs() + cluster.Stacks());
    Status ok = cluster.CheckInvariants();
    ASSERT_TRUE(ok.ok()) << Failure(fmt::format("{} seed {} round {} (killed {} after {} ms): {}", label, seed, round,
                                                victim->name(), delay.count(), ok.ToString()),
                                    cluster.Logs());
    kills[victim->name()]++;
    auto t = cluster.totals();
    std::printf("%s round %llu/%llu: killed %s %lld ms after %s, down %lld ms; ok (announced %llu, reads %llu, torn %llu, "
                "dead segments %llu, temp files %llu, producer segments %llu of %llu allowed, %llu for queued flushes)\n",
                label, static_cast<unsigned long long>(round), static_cast<unsigned long long>(rounds),
                victim->name().c_str(), static_cast<long long>(delay.count()),
                after_announce ? "an announce" : "the last check", static_cast<long long>(down.count()),
                static_cast<unsigned long long>(t.announced), static_cast<unsigned long long>(t.reads),
                static_cast<unsigned long long>(t.torn), static_cast<unsigned long long>(t.dead_segments),
                static_cast<unsigned long long>(t.dead_temp_files), static_cast<unsigned long long>(t.live_segments),
                static_cast<unsigned long long>(t.live_segments_bound), static_cast<unsigned long long>(t.flushes_queued));
    std::fflush(stdout);
  }
  std::string summary;
  for (const auto& [name, n] : kills) summary += fmt::format(" {}={}", name, n);
  std::printf("%s kills:%s\n", label, summary.c_str());
}

#ifdef VIPER_FAULT_REDIS
// A redis-server on a free loopback port, started at construction (the cluster's arguments name
// its port); Start() after a Kill starts it again on the same port, empty (no persistence).
class RedisMember : public Member {
 public:
  RedisMember() : started_(server_.Start()) {}
  const std::string& started() const { return started_; }  // "" if the first start worked
  const std::string& name() const override { return name_; }
  Status Start() override {
    if (server_.running()) return Status::OK();  // the cluster's first start: running since construction
    std::string why = server_.Restart();
    ++lives_;
    return why.empty() ? Status::OK() : Status::Unavailable(why);
  }
  void Kill() override { server_.Kill(); }
  void Stop() override { server_.Stop(); }
  bool running() override { return server_.running(); }
  int lives() const override { return lives_; }
  std::string log() const override { return server_.log(); }
  std::string url() const { return server_.url(); }

 private:
  std::string name_ = "redis";
  RedisServer server_;
  std::string started_;
  int lives_ = 1;
};

// The newest version `address` holds of `model` (0 if none or unreachable).
uint64_t NewestHeld(const std::string& address, const std::string& model) {
  ClientOptions co;
  co.connect = address;
  co.name = "fault-registry-check";
  auto client = Client::Connect(co);
  if (!client.ok()) return 0;
  std::set<uint64_t> held = HeldBy(**client, model);
  return held.empty() ? 0 : *held.rbegin();
}

// After every round: Redis lists the producer's node and the relay as holders of the newest version
// each held when the check began (they registered again after Redis, or they, restarted).
Status CheckRegistered(FaultCluster& cluster, const std::string& url, const std::string& model) {
  for (const std::string& address : {cluster.producer_address(), cluster.relay_address()}) {
    const uint64_t target = NewestHeld(address, model);
    if (target == 0) return Status::Unavailable("node " + address + " lists no version of " + model);
    uint64_t registered = 0;
    bool ok = WaitUntil(
        [&] {
          auto registry = OpenRegistry(url);  // each try: Redis may be restarting
          if (!registry.ok()) return false;
          std::set<uint64_t> listed = RegisteredFor(**registry, model, address);
          registered = listed.empty() ? 0 : *listed.rbegin();
          return registered >= target;
        },
        30s);
    if (!ok)
      return Status::NotFound(fmt::format("Redis lists {} version {} at most for node {}, which held {} (30 s after "
                                          "the round)", model, registered, address, target));
  }
  return Status::OK();
}
#endif

void RunFaultSuite(const std::string& mode, uint64_t rounds, bool redis = false) {
  const uint64_t seed = FaultSeed();
  const std::string label = "fault[" + mode + (redis ? ", redis" : "") + "]";
  std::printf("%s seed %llu, %llu rounds (replay: VIPER_FAULT_SEED=%llu VIPER_FAULT_ROUNDS=%llu)\n", label.c_str(),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds));
  std::fflush(stdout);
  TempDir dir;
  FaultClusterOptions options;
  options.dir = dir.path();
  options.seed = seed;
  options.mode = mode;
#ifdef VIPER_FAULT_REDIS
  std::unique_ptr<RedisMember> redis_member;
  std::string url;
  if (redis) {
    redis_member = std::make_unique<RedisMember>();
    ASSERT_EQ(redis_member->started(), "");
    url = redis_member->url();
    // Records of 1.5 s, put again every 0.5 s: a restarted Redis is filled again within a round.
    options.producer_args = {"--registry", url, "--registry-ttl-ms", "1500"};
    options.relay_args = {"--registry", url, "--registry-ttl", "1.5"};
  }
#else
  ASSERT_FALSE(redis) << "built without Redis";
#endif
  FaultCluster cluster(options);
#ifdef VIPER_FAULT_REDIS
  if (redis_member) {
    cluster.AddMember(std::move(redis_member));
    cluster.AddCheck("registry", [&cluster, url, model = options.model] {
      return CheckRegistered(cluster, url, model);
    });
  }
#endif
  Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString() << "\n" << cluster.Logs();
  Status first = cluster.WaitForProgress(60s);
  if (first.ok()) first = cluster.CheckInvariants();
  ASSERT_TRUE(first.ok()) << Failure(fmt::format("{} seed {}: before the first kill: {}", label, seed, first.ToString()),
                                     cluster.Logs());
  RunRounds(cluster, seed, rounds, label.c_str());
  if (::testing::Test::HasFatalFailure()) return;
  Status full = cluster.CheckInvariants(/*full=*/true);
  ASSERT_TRUE(full.ok()) << Failure(fmt::format("{} seed {}: final check: {}", label, seed, full.ToString()),
                                    cluster.Logs());
  auto t = cluster.totals();
  Status stopped = cluster.Stop();
  ASSERT_TRUE(stopped.ok()) << Failure(fmt::format("{} seed {}: {}", label, seed, stopped.ToString()), cluster.Logs());
  std::printf("%s survived %llu rounds: %llu versions announced, all fetchable (%llu verified fetches), %llu reads, "
              "torn 0, leaked segments 0, leaked temp files 0; versions recovered from a killed producer's segments "
              "%llu, interrupted file writes removed %llu (seed %llu)\n",
              label.c_str(), static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(t.announced),
              static_cast<unsigned long long>(t.verified_fetches), static_cast<unsigned long long>(t.reads),
              static_cast<unsigned long long>(t.recovered_from_segments),
              static_cast<unsigned long long>(t.interrupted_writes_removed), static_cast<unsigned long long>(seed));
}

// Sync publishes: Commit returns after the announce, so the producer's own log counts too.
TEST(Fault, KillProducerRelayOrConsumerAtRandomPointsSync) {
  RunFaultSuite("sync", EnvOr("VIPER_FAULT_ROUNDS", 50) / 2 + EnvOr("VIPER_FAULT_ROUNDS", 50) % 2);
}

// Async publishes: the seal, announce and flush run behind the producer's back. With Redis built
// in, the nodes register in a redis-server that the rounds kill too.
TEST(Fault, KillProducerRelayConsumerOrRedisAtRandomPointsAsync) {
#ifdef VIPER_FAULT_REDIS
  RunFaultSuite("async", EnvOr("VIPER_FAULT_ROUNDS", 50) / 2, /*redis=*/true);
#else
  RunFaultSuite("async", EnvOr("VIPER_FAULT_ROUNDS", 50) / 2);
#endif
}

}  // namespace
}  // namespace viper::testing

namespace viper::testing {
namespace {

// A tmpfs of `megabytes` mounted at `dir` for the test's life (needs root, as CI has).
class SmallTmpfs {
 public:
  SmallTmpfs(const fs::path& dir, int megabytes) : dir_(dir) {
    fs::create_directories(dir);
    std::string options = "size=" + std::to_string(megabytes) + "m,mode=0700";
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
    error_ = mounted_ ? "" : std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// The file tier fills up (a 64 MiB tmpfs, 6 MB versions): each failed flush says what failed and
// why, leaves no temporary file, and the memory path keeps serving every new version.
TEST(Fault, DiskFullOnTheFileTierKeepsTheMemoryPathWorking) {
  ASSERT_EQ(::geteuid(), 0u) << "mounting the small tmpfs needs root (CI runs as root)";
  TempDir dir;
  SmallTmpfs store(dir / "store", 64);
  ASSERT_TRUE(store.mounted()) << "mount tmpfs: " << store.error();
  const std::string versions = "20";
  Process producer({std::string(VIPER_BINARY_DIR) + "/bin/viper_fault_peer", "produce", "--model", "fm", "--listen",
                    "127.0.0.1:0", "--store-dir", (dir / "store").string(), "--segment-prefix",
                    "vdiskfull" + std::to_string(::getpid()), "--min-bytes", "6000000", "--max-bytes", "6000000",
                    "--versions", versions, "--interval-ms", "30", "--address-file", (dir / "addr").string(),
                    "--state-file", (dir / "state").string()},
                   dir / "producer.log");
  std::string addr = WaitForFile(dir / "addr", 30s);
  ASSERT_FALSE(addr.empty()) << producer.log();
  Process consumer({std::string(VIPER_BINARY_DIR) + "/bin/viper_fault_peer", "consume", "--model", "fm", "--connect",
                    addr, "--path", "map", "--threads", "2", "--until", versions, "--min-reads", "10", "--status",
                    (dir / "consumer.status").string()},
                   dir / "consumer.log");
  ASSERT_EQ(WaitForFile(dir / "state", 120s), "published " + versions) << producer.log();
  ASSERT_EQ(consumer.Wait(120s), 0) << consumer.log();
  std::string status = ReadFile(dir / "consumer.status");
  EXPECT_NE(status.find("\"errors\":0"), std::string::npos) << status;
  EXPECT_NE(status.find("\"live\":" + versions), std::string::npos) << "the memory path stopped: " << status;
  std::string log = producer.log();
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  EXPECT_NE(log.find("flush of fm version"), std::string::npos) << "the error names what failed: " << log;
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir / "store")) {
    std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "a failed write left " << entry.path();
    if (name.ends_with(".safetensors")) ++files;
  }
  EXPECT_GT(files, 0u);
  EXPECT_LT(files, 20u) << "the tmpfs should have filled up";
  // Every version the node lists is fetched whole and bit-exact, by SEND and by a lease on this
  // host: a version whose flush failed stays in memory (and listed) instead of being lost, and no
  // two listed versions name one segment (a recycled segment is never listed).
  ClientOptions co;
  co.connect = addr;
  co.name = "disk-full-checker";
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (auto deadline = std::chrono::steady_clock::now() + 60s;;) {
    auto counters = (*client)->Stats();
    ASSERT_TRUE(counters.ok()) << counters.status().ToString();
    if (counters->at("flushes_queued") == 0) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "flushes still queued after 60 s";
    std::this_thread::sleep_for(50ms);
  }
  auto listed = (*client)->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::set<uint64_t> numbers;
  std::set<std::string> segments;
  size_t fetched = 0;
  for (const auto& info : *listed) {
    if (info.model != "fm") continue;
    numbers.insert(info.version);
    for (const auto& r : info.replicas) {
      if (r.kind == proto::ReplicaKind::kHostSegment) {
        EXPECT_TRUE(segments.insert(r.locator).second) << "two listed versions name segment " << r.locator;
      }
    }
    std::vector<std::byte> buffer;
    auto sent = (*client)->FetchSend("fm", info.version, [&](const proto::VersionInfo& i) -> Result<std::span<std::byte>> {
      buffer.resize(i.size);
      return std::span<std::byte>(buffer);
    });
    ASSERT_TRUE(sent.ok()) << "listed version " << info.version << " by SEND: " << sent.status().ToString() << "\n"
                           << producer.log();
    auto snap = Snapshot::Parse(buffer, nullptr);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    EXPECT_EQ(CheckContent(*snap, "fm", info.version), "") << "listed version " << info.version << " by SEND";
    auto lease = (*client)->FetchLease("fm", info.version);
    ASSERT_TRUE(lease.ok()) << "listed version " << info.version << " by lease: " << lease.status().ToString();
    auto mapped = MapSegmentReadOnly(lease->segment, lease->info.size);
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    EXPECT_TRUE(std::equal(buffer.begin(), buffer.end(), mapped->data.begin(), mapped->data.end()))
        << "listed version " << info.version << ": the lease's bytes differ from the SEND's";
    (*client)->Release("fm", info.version);
    fetched++;
  }
  EXPECT_EQ(numbers.size(), 20u) << "a version announced on the full disk was lost (listed " << numbers.size()
                                 << "):\n" << producer.log();
  std::printf("disk full: %zu of %s versions fit on the 64 MiB file tier; every version reached the consumer through "
              "memory; no temporary file left; %zu versions listed after the disk filled, each fetched bit-exact "
              "by SEND and by lease\n", files, versions.c_str(), fetched);
  ::kill(producer.pid(), SIGTERM);
  EXPECT_EQ(producer.Wait(60s), 0) << producer.log();
}

// Entries of /dev/shm whose names start with `lead`.
std::vector<std::string> ShmNamesStartingWith(const std::string& lead) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().starts_with(lead)) out.push_back(e.path().filename().string());
  }
  return out;
}

// A producer of model "fm" on `store` whose flushes fail (the model's directory is a file; a full
// disk fails the same way), killed after two versions: its segments (prefix `segment_prefix`
// plus the store's hash) hold versions the file tier never got. *pid: the dead producer's.
void KillProducerWithUnflushedVersions(const TempDir& dir, const fs::path& store, const std::string& segment_prefix,
                                       pid_t* pid) {
  fs::create_directories(store);
  std::ofstream(store / "fm") << "in the way of the model directory";
  Process producer({std::string(VIPER_BINARY_DIR) + "/bin/viper_fault_peer", "produce", "--model", "fm", "--listen",
                    "127.0.0.1:0", "--store-dir", store.string(), "--segment-prefix", segment_prefix, "--min-bytes",
                    "100000", "--max-bytes", "100000", "--versions", "2", "--interval-ms", "10", "--address-file",
                    (dir / "addr").string(), "--state-file", (dir / "state").string()},
                   dir / "producer.log");
  ASSERT_EQ(WaitForFile(dir / "state", 60s), "published 2") << producer.log();
  ASSERT_NE(producer.log().find("kept in memory"), std::string::npos) << producer.log();
  producer.Kill(SIGKILL);
  *pid = producer.pid();
}

// A killed producer left versions in shared memory that its flushes could not write (here its
// model's directory is a file; a full disk fails the same way). A restart that cannot write them
// either keeps their segments (and numbers new versions above them); the next restart that can,
// recovers them. Before, the first restart logged "not recovered" and then removed the segments.
TEST(Fault, RecoveryKeepsTheSegmentsItCouldNotSave) {
  TempDir dir;
  const fs::path store = dir / "store";
  const std::string segment_prefix = "vkeep" + std::to_string(::getpid());
  pid_t producer = 0;
  KillProducerWithUnflushedVersions(dir, store, segment_prefix, &producer);
  if (HasFatalFailure()) return;
  const std::string lead = segment_prefix + "-";  // the node adds its store's hash
  const std::string dead = "." + std::to_string(producer) + ".";
  ASSERT_FALSE(ShmNamesStartingWith(lead).empty()) << "the killed producer left no segment";

  NodeOptions options;
  options.store_dir = store;
  options.segment_prefix = segment_prefix;
  ::testing::internal::CaptureStderr();
  auto node = Node::Start(options);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(node.ok()) << node.status().ToString() << log;
  std::vector<std::string> kept;
  for (const std::string& name : ShmNamesStartingWith(lead)) {
    if (name.find(dead) != std::string::npos) kept.push_back(name);
  }
  ASSERT_FALSE(kept.empty()) << "the segments recovery could not save were removed:\n" << log;
  for (const std::string& name : kept) EXPECT_NE(log.find("/dev/shm/" + name), std::string::npos) << log;
  EXPECT_NE(log.find("fm version 2"), std::string::npos) << log;
  auto next = (*node)->ReserveVersion("fm");
  ASSERT_TRUE(next.ok());
  EXPECT_GT(*next, 2u) << "the number of a kept version was handed out again";
  node->reset();

  fs::remove(store / "fm");  // the operator makes room
  ::testing::internal::CaptureStderr();
  node = Node::Start(options);
  log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(node.ok()) << node.status().ToString() << log;
  EXPECT_TRUE((*node)->file_tier()->Find("fm", 2)) << log;
  ASSERT_TRUE((*node)->Latest("fm")) << log;
  EXPECT_EQ((*node)->Latest("fm")->version, 2u) << log;
  for (const std::string& name : ShmNamesStartingWith(lead)) {
    EXPECT_EQ(name.find(dead), std::string::npos) << "left after it was saved: " << name;
  }
  node->reset();
}

// A node restarted with its predecessor's pid (a container restarted after an OOM kill, whose
// memory-backed /dev/shm survives, gets the same small pid) recovers the predecessor's segments:
// with a store, the store's lock, not the pid in a segment's name, says whose they are. Before,
// a segment named with this process's pid was taken for its own: neither recovered nor removed,
// and the version's number handed out again.
TEST(Fault, RecoveryDoesNotGoByThePidInTheSegmentsName) {
  TempDir dir;
  const fs::path store = dir / "store";
  const std::string segment_prefix = "vsamepid" + std::to_string(::getpid());
  pid_t producer = 0;
  KillProducerWithUnflushedVersions(dir, store, segment_prefix, &producer);
  if (HasFatalFailure()) return;
  const std::string lead = segment_prefix + "-";
  const std::string dead = "." + std::to_string(producer) + ".";
  const std::string mine = "." + std::to_string(::getpid()) + ".";
  int renamed = 0;
  for (const std::string& name : ShmNamesStartingWith(lead)) {
    const size_t at = name.find(dead);
    if (at == std::string::npos) continue;
    std::string as_mine = name;
    as_mine.replace(at, dead.size(), mine);
    fs::rename(fs::path("/dev/shm") / name, fs::path("/dev/shm") / as_mine);
    ++renamed;
  }
  ASSERT_GT(renamed, 0) << "the killed producer left no segment";
  fs::remove(store / "fm");

  NodeOptions options;
  options.store_dir = store;
  options.segment_prefix = segment_prefix;
  ::testing::internal::CaptureStderr();
  auto node = Node::Start(options);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(node.ok()) << node.status().ToString() << log;
  EXPECT_TRUE((*node)->file_tier()->Find("fm", 2)) << log;
  ASSERT_TRUE((*node)->Latest("fm")) << log;
  EXPECT_EQ((*node)->Latest("fm")->version, 2u) << log;
  auto next = (*node)->ReserveVersion("fm");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 3u);
  node->reset();
  EXPECT_TRUE(ShmNamesStartingWith(lead).empty()) << "a predecessor's segment was left in /dev/shm";
}

}  // namespace
}  // namespace viper::testing
