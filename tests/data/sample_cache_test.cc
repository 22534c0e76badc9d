// The collaborative sample cache (include/viper/sample_cache.h) and the ranks' share of an epoch
// (PrefetchOptions::rank, world_size), with real nodes on loopback, real UCX and real files:
// every sample once per epoch across the ranks; after the first epoch no rank reads the source
// and every byte is the sample's; ownership by rendezvous hashing moves only the samples of a node
// that joins or leaves; a node that dies costs only its own samples.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "viper/prefetch.h"
#include "viper/sample_cache.h"

namespace viper {
namespace {

using testing::MakeSampleTree;
using testing::SampleBytes;
using testing::TempDir;

// A source that counts its reads (the "parallel file system" of the test).
class CountingSource : public SampleSource {
 public:
  explicit CountingSource(std::shared_ptr<const SampleSource> base) : base_(std::move(base)) {}
  uint64_t size() const override { return base_->size(); }
  uint64_t bytes(uint64_t id) const override { return base_->bytes(id); }
  int64_t label(uint64_t id) const override { return base_->label(id); }
  std::string Describe(uint64_t id) const override { return base_->Describe(id); }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    reads++;
    return base_->ReadInto(id, dst);
  }
  mutable std::atomic<uint64_t> reads{0};

 private:
  std::shared_ptr<const SampleSource> base_;
};

constexpr int kClasses = 4, kPerClass = 30;  // 120 samples
constexpr size_t kBytes = 3000;

size_t CountOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::shared_ptr<CountingSource> Tree(const TempDir& dir) {
  MakeSampleTree(dir.path(), kClasses, kPerClass, kBytes);
  DirectorySourceOptions o;
  o.dir = dir.path();
  auto src = OpenDirectorySource(o);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  return std::make_shared<CountingSource>(*src);
}

// Ports the kernel hands out on 127.0.0.1, all held until every one is picked (so they differ).
// n loopback ports free now, drawn from below the kernel's ephemeral range (32768-60999 here):
// a port that bind(0) handed out and that was released again can be taken by any process's next
// outgoing connection before the node listens on it (CI saw "address already in use"); outgoing
// connections never take a port below that range.
std::vector<std::string> LoopbackNodes(size_t n) {
  std::vector<int> fds;
  std::vector<std::string> nodes;
  std::mt19937 rng(std::random_device{}());
  while (nodes.size() < n) {
    const uint16_t port = static_cast<uint16_t>(20000 + rng() % 12000);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {  // taken: draw again
      ::close(fd);
      continue;
    }
    nodes.push_back("127.0.0.1:" + std::to_string(port));
    fds.push_back(fd);  // held until all are drawn, so that they differ
  }
  for (int fd : fds) ::close(fd);
  return nodes;
}

// One rank's whole epoch: the ids it got, each sample's bytes checked.
std::vector<uint64_t> Epoch(Prefetcher& p) {
  std::vector<uint64_t> ids;
  while (true) {
    auto s = p.Next();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok() || !s->has_value()) break;
    const Sample& x = **s;
    auto want = SampleBytes(x.id, kBytes);
    EXPECT_EQ(0, std::memcmp(want.data(), x.bytes.data(), kBytes)) << "sample " << x.id;
    ids.push_back(x.id);
  }
  return ids;
}

TEST(RankShareTest, EverySampleOncePerEpochAcrossRanks) {
  TempDir dir;
  auto src = Tree(dir);
  constexpr uint64_t kWorld = 7;  // 120 = 7 * 17 + 1: rank 0 gets 18, the others 17
  std::vector<std::unique_ptr<Prefetcher>> ranks;
  for (uint64_t r = 0; r < kWorld; ++r) {
    PrefetchOptions o;
    o.epochs = 3;
    o.seed = 42;
    o.rank = r;
    o.world_size = kWorld;
    auto p = Prefetcher::Start(src, o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ((*p)->epoch_size(), r == 0 ? 18u : 17u);
    ranks.push_back(std::move(*p));
  }
  std::vector<std::set<uint64_t>> firsts(kWorld);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<uint64_t> all;
    for (uint64_t r = 0; r < kWorld; ++r) {
      auto ids = Epoch(*ranks[r]);
      EXPECT_EQ(ids.size(), r == 0 ? 18u : 17u) << "rank " << r << " epoch " << epoch;
      all.insert(ids.begin(), ids.end());
      if (epoch == 0) firsts[r] = std::set<uint64_t>(ids.begin(), ids.end());
      if (epoch == 1) {
        EXPECT_NE(firsts[r], std::set<uint64_t>(ids.begin(), ids.end())) << "a fresh share per epoch";
      }
    }
    ASSERT_EQ(all.size(), 120u);
    EXPECT_EQ(std::set<uint64_t>(all.begin(), all.end()).size(), 120u) << "every sample exactly once, epoch " << epoch;
  }
}

TEST(RankShareTest, BadRankOrWorldSizeNamed) {
  TempDir dir;
  auto src = Tree(dir);
  PrefetchOptions o;
  o.rank = 4;
  o.world_size = 4;
  auto p = Prefetcher::Start(src, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("rank must be in [0, world_size = 4), got 4"), std::string::npos)
      << p.status().ToString();
  o.rank = 0;
  o.world_size = 121;
  p = Prefetcher::Start(src, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("world_size must be in [1, samples = 120], got 121"), std::string::npos)
      << p.status().ToString();
}

TEST(SampleOwnerTest, BalancedAndOnlyTheConcernedSamplesMove) {
  std::vector<std::string> four = {"10.0.0.1:7500", "10.0.0.2:7500", "10.0.0.3:7500", "10.0.0.4:7500"};
  std::vector<std::string> five = four;
  five.push_back("10.0.0.5:7500");
  std::vector<std::string> three = {four[0], four[1], four[3]};  // 10.0.0.3 left
  std::vector<std::string> shuffled = {four[2], four[0], four[3], four[1]};
  constexpr uint64_t kN = 40000;
  std::map<std::string, uint64_t> held;
  uint64_t moved_join = 0, moved_leave = 0;
  for (uint64_t id = 0; id < kN; ++id) {
    const std::string& o4 = four[SampleOwner(id, four)];
    held[o4]++;
    EXPECT_EQ(o4, shuffled[SampleOwner(id, shuffled)]) << "the order of the members does not matter";
    const std::string& o5 = five[SampleOwner(id, five)];
    if (o5 != o4) {
      moved_join++;
      EXPECT_EQ(o5, five[4]) << "a join moves samples only to the new node";
    }
    const std::string& o3 = three[SampleOwner(id, three)];
    if (o3 != o4) {
      moved_leave++;
      EXPECT_EQ(o4, four[2]) << "a leave moves only the samples the node held";
    }
  }
  for (const auto& [node, n] : held) EXPECT_NEAR(static_cast<double>(n) / kN, 0.25, 0.02) << node;
  EXPECT_NEAR(static_cast<double>(moved_join) / kN, 0.2, 0.02);
  EXPECT_EQ(moved_leave, held[four[2]]);
}

struct Rank {
  std::shared_ptr<SampleCache> cache;
  std::unique_ptr<Prefetcher> prefetcher;
};

std::vector<Rank> StartRanks(std::shared_ptr<CountingSource> src, const std::vector<std::string>& nodes,
                             uint64_t epochs) {
  std::vector<Rank> ranks;
  for (size_t r = 0; r < nodes.size(); ++r) {
    SampleCacheOptions co;
    co.nodes = nodes;
    co.self = r;
    co.name = "test";
    co.retry_down = std::chrono::milliseconds(60000);
    auto c = SampleCache::Open(src, co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return {};
    PrefetchOptions o;
    o.epochs = epochs;
    o.seed = 7;
    o.rank = r;
    o.world_size = nodes.size();
    o.readers = 3;
    o.autotune = false;  // read-ahead stays at buffer_samples (16): the bound on source reads below
    auto p = Prefetcher::Start(*c, o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    ranks.push_back({*c, std::move(*p)});
  }
  return ranks;
}

TEST(SampleCacheTest, AfterTheFirstEpochNoRankReadsTheSource) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(3);
  constexpr int kEpochs = 4;
  auto ranks = StartRanks(src, nodes, kEpochs);
  ASSERT_EQ(ranks.size(), 3u);
  // The ranks run side by side, in step per epoch as training ranks are (the all-reduce).
  std::vector<uint64_t> reads_after;  // source reads when every rank has finished epoch e
  std::vector<std::multiset<uint64_t>> seen(kEpochs);
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    std::vector<std::vector<uint64_t>> got(ranks.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks.size(); ++r) threads.emplace_back([&, r] { got[r] = Epoch(*ranks[r].prefetcher); });
    for (auto& t : threads) t.join();
    reads_after.push_back(src->reads);
    for (auto& ids : got) seen[epoch].insert(ids.begin(), ids.end());
    EXPECT_EQ(seen[epoch].size(), 120u);
    EXPECT_EQ(std::set<uint64_t>(seen[epoch].begin(), seen[epoch].end()).size(), 120u) << "epoch " << epoch;
  }
  // The first epoch reads every sample once, plus at most what the readers read ahead into the
  // next epoch before the other ranks had read (and cached) it: then nothing more.
  // A read-ahead that asked a sample's owner just before the owner's put of it landed reads the
  // source once more, possibly after the first epoch ended: the bound holds through the second.
  EXPECT_GE(reads_after[0], 120u);
  EXPECT_LE(reads_after[1], 120u + 3 * 16u);
  EXPECT_EQ(reads_after.back(), reads_after[1]) << "no source read after the second epoch";
  uint64_t hits = 0, remote = 0, held = 0;
  for (auto& r : ranks) {
    SampleCacheStats s = r.cache->stats();
    hits += s.local_hits + s.remote_hits, remote += s.remote_hits, held += s.node_samples;
    EXPECT_EQ(s.source_bytes, s.source_reads * kBytes);
    EXPECT_EQ(s.put_failures, 0u);
    EXPECT_EQ(s.peer_failures, 0u);
    EXPECT_TRUE(s.down.empty());
    EXPECT_GT(s.node_samples, 20u) << "each node owns about a third";
    EXPECT_GE(s.node_bytes, s.node_samples * kBytes);
  }
  EXPECT_EQ(held, 120u) << "each sample in exactly one node";
  EXPECT_EQ(hits + reads_after.back(), 120u * kEpochs) << "every read a hit or a source read, none twice";
  EXPECT_GT(remote, hits / 2) << "with 3 nodes about two thirds come from another node";
}

TEST(SampleCacheTest, ADeadNodeCostsOnlyItsOwnSamples) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(3);
  auto ranks = StartRanks(src, nodes, 1);
  ASSERT_EQ(ranks.size(), 3u);
  for (auto& r : ranks) Epoch(*r.prefetcher);
  ASSERT_EQ(src->reads, 120u);
  uint64_t owned_by_2 = 0;
  for (uint64_t id = 0; id < 120; ++id) owned_by_2 += SampleOwner(id, nodes) == 2 ? 1 : 0;
  ranks[2].prefetcher.reset();
  ranks[2].cache.reset();  // node 2 dies
  // Ranks 0 and 1 now read every sample (e.g. the next epoch split two ways): what node 2 held
  // comes from the source once, and is then cached at its next owner.
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t before = src->reads;
    for (uint64_t id = 0; id < 120; ++id) {
      std::vector<std::byte> buf(kBytes);
      ASSERT_TRUE(ranks[id % 2].cache->ReadInto(id, buf).ok());
      EXPECT_EQ(buf, SampleBytes(id, kBytes)) << "sample " << id;
    }
    EXPECT_EQ(src->reads - before, pass == 0 ? owned_by_2 : 0u) << "pass " << pass;
  }
  for (int r = 0; r < 2; ++r) {
    SampleCacheStats s = ranks[r].cache->stats();
    EXPECT_EQ(s.down, std::vector<std::string>{nodes[2]}) << "rank " << r;
  }
  for (uint64_t id = 0; id < 120; ++id) EXPECT_NE(ranks[0].cache->OwnerOf(id), 2u);
}

TEST(SampleCacheTest, ProcessesOnOneHostShareOneNode) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(1);
  SampleCacheOptions co;
  co.nodes = nodes;
  co.name = "shared";
  auto owner = SampleCache::Open(src, co);  // runs the node
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  co.start_node = false;                     // attach to it
  auto a = SampleCache::Open(src, co);
  auto b = SampleCache::Open(src, co);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->address(), nodes[0]);
  for (SampleCache* c : {a->get(), b->get(), owner->get()}) {
    for (uint64_t id = 0; id < 120; ++id) {
      std::vector<std::byte> buf(kBytes);
      ASSERT_TRUE(c->ReadInto(id, buf).ok());
      ASSERT_EQ(buf, SampleBytes(id, kBytes)) << "sample " << id;
    }
  }
  EXPECT_EQ(src->reads, 120u) << "the first reader fills the shared cache; the others only read it";
  SampleCacheStats sa = (*a)->stats(), sb = (*b)->stats(), so = (*owner)->stats();
  EXPECT_EQ(sa.source_reads, 120u);
  EXPECT_EQ(sa.puts, 120u);
  EXPECT_EQ(sb.local_hits, 120u);
  EXPECT_EQ(so.local_hits, 120u);
  EXPECT_EQ(so.node_samples, 120u);
  EXPECT_EQ(sa.node_samples, 0u) << "an attached cache holds nothing itself";
}

// A data service's view of the cache: each job's reads counted apart (adding up to the cache's),
// and a cached sample pinned where another process of the host can map it.
TEST(SampleCacheTest, CountedViewsAddUpAndPinsNameTheSegment) {
  TempDir dir;
  auto src = Tree(dir);
  SampleCacheOptions co;
  co.nodes = LoopbackNodes(1);
  co.name = "service";
  auto c = SampleCache::Open(src, co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto ja = std::make_shared<SampleCacheJobCounters>(), jb = std::make_shared<SampleCacheJobCounters>();
  auto a = SampleCache::CountedView(*c, ja), b = SampleCache::CountedView(*c, jb);
  EXPECT_EQ((*c)->Pin(7).status().code(), StatusCode::kNotFound) << "not cached yet";
  std::vector<std::byte> buf(kBytes);
  for (uint64_t id = 0; id < 60; ++id) ASSERT_TRUE(a->ReadInto(id, buf).ok());
  for (uint64_t id = 0; id < 120; ++id) {
    ASSERT_TRUE(b->ReadInto(id, buf).ok());
    ASSERT_EQ(buf, SampleBytes(id, kBytes));
  }
  EXPECT_EQ(ja->source_reads, 60u);
  EXPECT_EQ(ja->hits, 0u);
  EXPECT_EQ(jb->source_reads, 60u);
  EXPECT_EQ(jb->hits, 60u);
  EXPECT_EQ(jb->source_bytes, 60 * kBytes);
  SampleCacheStats s = (*c)->stats();
  EXPECT_EQ(s.source_reads, ja->source_reads + jb->source_reads);
  EXPECT_EQ(s.local_hits, ja->hits + jb->hits);
  auto pin = (*c)->Pin(7);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  EXPECT_EQ(pin->nbytes, kBytes);
  EXPECT_TRUE(pin->segment.starts_with("vcache.")) << pin->segment;
  int fd = ::shm_open(("/" + pin->segment).c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0) << pin->segment;
  std::vector<std::byte> mapped(kBytes);
  ASSERT_EQ(::pread(fd, mapped.data(), kBytes, static_cast<off_t>(pin->offset)), static_cast<ssize_t>(kBytes));
  ::close(fd);
  EXPECT_EQ(mapped, SampleBytes(7, kBytes)) << "the pinned bytes are the sample's, where the pin says";
  co.start_node = false;
  auto attached = SampleCache::Open(src, co);
  ASSERT_TRUE(attached.ok());
  EXPECT_EQ((*attached)->Pin(7).status().code(), StatusCode::kFailedPrecondition);
}

// Readers of one process (the jobs of a data service) asking for one uncached sample at the same
// moment: one reads the source, the others wait for its put and take the cached copy.
TEST(SampleCacheTest, ConcurrentReadsOfOneSampleAreMerged) {
  TempDir dir;
  auto counting = Tree(dir);
  class Slow : public SampleSource {
   public:
    explicit Slow(std::shared_ptr<const SampleSource> base) : base_(std::move(base)) {}
    uint64_t size() const override { return base_->size(); }
    uint64_t bytes(uint64_t id) const override { return base_->bytes(id); }
    int64_t label(uint64_t id) const override { return base_->label(id); }
    std::string Describe(uint64_t id) const override { return base_->Describe(id); }
    Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return base_->ReadInto(id, dst);
    }

   private:
    std::shared_ptr<const SampleSource> base_;
  };
  SampleCacheOptions co;
  co.nodes = LoopbackNodes(1);
  co.name = "merged";
  auto c = SampleCache::Open(std::make_shared<Slow>(counting), co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      std::vector<std::byte> buf(kBytes);
      if ((*c)->ReadInto(9, buf).ok() && buf == SampleBytes(9, kBytes)) good++;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(good, 4);
  EXPECT_EQ(counting->reads, 1u) << "one source read for four readers of one sample";
  EXPECT_EQ((*c)->stats().local_hits, 3u);
}

TEST(SampleCacheTest, BudgetRefusesPutsAndTheSourceServesTheRest) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(1);
  SampleCacheOptions co;
  co.nodes = nodes;
  co.name = "budget";
  co.max_samples = 10;  // the node holds 10 of the 120
  auto c = SampleCache::Open(src, co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t id = 0; id < 120; ++id) {
      std::vector<std::byte> buf(kBytes);
      ASSERT_TRUE((*c)->ReadInto(id, buf).ok());
      EXPECT_EQ(buf, SampleBytes(id, kBytes));
    }
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  SampleCacheStats s = (*c)->stats();
  EXPECT_EQ(s.node_samples, 10u);
  EXPECT_EQ(s.local_hits, 10u);
  EXPECT_EQ(s.source_reads, 230u);
  EXPECT_EQ(s.put_failures, 220u);
  // Said once, in the cache's terms, at the default level (before: one info line per refused
  // sample, about "models", and nothing at all at the default level).
  EXPECT_EQ(CountOf(said, "is full"), 1u) << said;
  EXPECT_NE(said.find("warn sample-cache: cache 'budget' node " + nodes[0] + " is full"), std::string::npos) << said;
  EXPECT_NE(said.find("max_samples"), std::string::npos) << said;
}

// A node that another rank puts into is full: that rank says so once, naming the node.
TEST(SampleCacheTest, ARankSaysOnceThatAnotherRanksNodeIsFull) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(2);
  std::vector<std::shared_ptr<SampleCache>> caches;
  for (size_t r = 0; r < 2; ++r) {
    SampleCacheOptions co;
    co.nodes = nodes;
    co.self = r;
    co.name = "full";
    co.max_samples = r == 0 ? 5 : 0;  // node 0 holds 5 samples at most
    auto c = SampleCache::Open(src, co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    caches.push_back(*c);
  }
  ::testing::internal::CaptureStderr();
  size_t owned_by_0 = 0;
  for (uint64_t id = 0; id < 120; ++id) {
    std::vector<std::byte> buf(kBytes);
    ASSERT_TRUE(caches[1]->ReadInto(id, buf).ok());  // rank 1 puts node 0's samples there
    EXPECT_EQ(buf, SampleBytes(id, kBytes));
    owned_by_0 += caches[1]->OwnerOf(id) == 0;
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_GT(owned_by_0, 5u);
  EXPECT_EQ(caches[0]->stats().node_samples, 5u);
  EXPECT_EQ(caches[1]->stats().put_failures, owned_by_0 - 5);
  EXPECT_EQ(CountOf(said, "is full"), 1u) << said;
  EXPECT_NE(said.find("cache 'full' node " + nodes[0] + " is full"), std::string::npos) << said;
}

// Named objects (the distributed rehearsal buffer's packs) travel over the same nodes: a put
// replaces the node's earlier one, any rank gets the latest from any node, a node that holds none
// says NotFound, a dead node Unavailable (and stays left out), a bad key is named.
TEST(SampleCacheTest, ObjectsGoThroughTheSameNodes) {
  TempDir dir;
  auto src = Tree(dir);
  auto nodes = LoopbackNodes(3);
  auto ranks = StartRanks(src, nodes, 1);
  ASSERT_EQ(ranks.size(), 3u);
  auto bytes = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  auto text = [](const std::vector<std::byte>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size()); };
  ASSERT_TRUE(ranks[0].cache->PutObject("pack-0", bytes("first")).ok());
  ASSERT_TRUE(ranks[0].cache->PutObject("pack-0", bytes("second, longer")).ok());
  for (size_t r = 0; r < 3; ++r) {
    auto got = ranks[r].cache->GetObject(0, "pack-0");
    ASSERT_TRUE(got.ok()) << "rank " << r << ": " << got.status().ToString();
    EXPECT_EQ(text(*got), "second, longer") << "rank " << r;
  }
  EXPECT_EQ(ranks[1].cache->GetObject(0, "pack-1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ranks[1].cache->GetObject(1, "pack-1").status().code(), StatusCode::kNotFound);
  auto bad = ranks[1].cache->PutObject("a.b", bytes("x"));
  EXPECT_NE(bad.message().find("key='a.b' must be 1-48 characters of [A-Za-z0-9_-]"), std::string::npos) << bad.ToString();
  EXPECT_NE(ranks[1].cache->GetObject(3, "pack-0").status().message().find("node=3: nodes has 3 entries"),
            std::string::npos);
  EXPECT_EQ(ranks[0].cache->GetObject(2, "pack-2").status().code(), StatusCode::kNotFound);  // connected
  ranks[2].prefetcher.reset();
  ranks[2].cache.reset();  // node 2 dies
  EXPECT_FALSE(ranks[0].cache->GetObject(2, "pack-2").ok());
  EXPECT_EQ(ranks[0].cache->GetObject(2, "pack-2").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ranks[0].cache->stats().down, std::vector<std::string>{nodes[2]});
}

TEST(SampleCacheTest, BadOptionsNamed) {
  TempDir dir;
  auto src = Tree(dir);
  auto expect = [&](SampleCacheOptions o, const std::string& text) {
    auto c = SampleCache::Open(src, o);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(text), std::string::npos) << c.status().ToString();
  };
  SampleCacheOptions o;
  o.name = "x";
  expect(o, "nodes is empty");
  o.nodes = {"127.0.0.1:1", "127.0.0.1:2"};
  o.self = 2;
  expect(o, "self=2 is out of range: nodes has 2 entries");
  o.self = 0;
  o.nodes = {"127.0.0.1"};
  expect(o, "nodes[0]='127.0.0.1' must be HOST:PORT");
  o.nodes = {"127.0.0.1:1", "127.0.0.1:1"};
  expect(o, "nodes[0]='127.0.0.1:1' is listed twice");
  o.nodes = {"127.0.0.1:1"};
  o.name = "a.b";
  expect(o, "name='a.b' must be 1-64 characters of [A-Za-z0-9_-]");
  o.name = "x";
  o.max_samples = MaxCachedSamples() + 1;  // more mappings than the process may have
  expect(o, "max_samples=" + std::to_string(o.max_samples) + " is more than this host allows a node: " +
                std::to_string(MaxCachedSamples()) + " (one mapping per sample: vm.max_map_count");
}

// Samples of `bytes` bytes made in memory (sample i: every byte i % 251).
class MemorySource : public SampleSource {
 public:
  MemorySource(uint64_t n, uint64_t bytes) : n_(n), bytes_(bytes) {}
  uint64_t size() const override { return n_; }
  uint64_t bytes(uint64_t) const override { return bytes_; }
  int64_t label(uint64_t) const override { return 0; }
  std::string Describe(uint64_t id) const override { return "sample " + std::to_string(id); }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    std::memset(dst.data(), static_cast<int>(id % 251), dst.size());
    return Status::OK();
  }

 private:
  uint64_t n_, bytes_;
};

size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A node holds a sample without a file descriptor for it: 4,000 samples are cached with the
// process allowed 512 more descriptors than it had (each segment kept one open before: a cache
// stopped caching, and its process could open no file, at RLIMIT_NOFILE's usual 1024), and the
// default max_samples lets a node hold them.
TEST(SampleCacheTest, ACacheHoldsNoDescriptorPerSample) {
  constexpr uint64_t kSamples = 4000;
  auto src = std::make_shared<MemorySource>(kSamples, 64);
  SampleCacheOptions co;
  co.nodes = LoopbackNodes(1);
  co.name = "fds";
  auto c = SampleCache::Open(src, co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = OpenDescriptors() + 512;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const size_t before = OpenDescriptors();
  std::vector<std::byte> buf(64);
  for (uint64_t id = 0; id < kSamples; ++id) ASSERT_TRUE((*c)->ReadInto(id, buf).ok()) << id;
  const size_t after = OpenDescriptors();
  ::setrlimit(RLIMIT_NOFILE, &old);
  SampleCacheStats s = (*c)->stats();
  EXPECT_EQ(s.node_samples, kSamples);
  EXPECT_EQ(s.put_failures, 0u);
  EXPECT_LT(after, before + 64) << "descriptors grew with the samples cached";
  for (uint64_t id : {uint64_t{0}, uint64_t{1234}, kSamples - 1}) {  // the second pass is served by the node
    ASSERT_TRUE((*c)->ReadInto(id, buf).ok());
    EXPECT_EQ(buf, std::vector<std::byte>(64, static_cast<std::byte>(id % 251)));
  }
  EXPECT_EQ((*c)->stats().local_hits, 3u);
}

}  // namespace
}  // namespace viper
