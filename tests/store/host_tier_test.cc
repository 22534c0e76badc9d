// HostTier against real POSIX shared memory (/dev/shm) and real processes (fork, SIGKILL).
#include "store/host_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/fd.h"
#include "store/store_test_util.h"

namespace viper {
namespace {

using testing::ShmEntries;
using testing::UniqueName;

constexpr uint64_t kSize = 1 << 20;

HostTierOptions Options(size_t keep = 2) {
  HostTierOptions o;
  o.prefix = UniqueName("vst");
  o.keep_versions = keep;
  return o;
}

std::unique_ptr<HostTier> OpenTier(const HostTierOptions& o) {
  auto tier = HostTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// Allocates, fills with `seed`'s pattern, commits; returns the segment name.
std::string Publish(HostTier& tier, const std::string& model, uint64_t version, uint64_t seed,
                    uint64_t size = kSize) {
  auto lease = tier.Allocate(size);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
  if (!lease.ok()) return "";
  testing::FillPattern(lease->data(), seed);
  std::string name = lease->segment_name();
  Status st = tier.Commit(std::move(*lease), model, version);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return name;
}

std::vector<std::byte> Pattern(uint64_t seed, uint64_t size = kSize) {
  std::vector<std::byte> v(size);
  testing::FillPattern(v, seed);
  return v;
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

TEST(HostTier, AllocateCommitAcquireRoundTrip) {
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  std::string name = Publish(*tier, "nt3", 1, 7);
  EXPECT_TRUE(name.starts_with(tier->options().prefix + "." + std::to_string(::getpid()) + "."));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + name));

  auto lease = tier->Acquire("nt3", 1);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(SameBytes(lease->data(), Pattern(7)));
  EXPECT_EQ(lease->segment_name(), name);
  EXPECT_EQ(lease->model(), "nt3");
  EXPECT_EQ(lease->version(), 1u);
  EXPECT_EQ(tier->latest("nt3"), 1u);
  EXPECT_EQ(tier->versions("nt3"), std::vector<uint64_t>{1});
  EXPECT_EQ(tier->models(), std::vector<std::string>{"nt3"});
  EXPECT_FALSE(tier->latest("other").has_value());

  HostTierStats s = tier->stats();
  EXPECT_EQ(s.committed_segments, 1u);
  EXPECT_EQ(s.fresh_allocations, 1u);
  EXPECT_GE(s.mapped_bytes, kSize);
}

// Fraction of the pages of [p, p + n) mapped in this process's page tables (/proc/self/pagemap,
// bit 63 "present"). Unlike counting page faults while writing, this does not see a sanitizer's
// shadow memory faulting in beside the segment.
double MappedFraction(const void* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  Fd pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  EXPECT_GE(pagemap.get(), 0) << std::strerror(errno);
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / page;
  std::vector<uint64_t> entries((n + page - 1) / page);
  ssize_t got = ::pread(pagemap.get(), entries.data(), entries.size() * sizeof(uint64_t),
                        static_cast<off_t>(first * sizeof(uint64_t)));
  EXPECT_EQ(got, static_cast<ssize_t>(entries.size() * sizeof(uint64_t))) << std::strerror(errno);
  size_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return static_cast<double>(present) / static_cast<double>(entries.size());
}

// Allocate maps the reserved pages into the writer's page tables (Reserve: fallocate, then
// PrefaultForWrite), so the producer's copy into a fresh segment takes no page faults (without
// it, none of a fresh segment's pages is mapped: 16384 faults for 64 MiB).
TEST(HostTier, FreshSegmentsAreMappedBeforeTheyAreWritten) {
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  constexpr uint64_t kBig = 64u << 20;
  auto lease = tier->Allocate(kBig);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(MappedFraction(lease->data().data(), kBig), 1.0);
}

TEST(HostTier, KeepSpareMakesTheNextAllocateRecycleUpToOneModelsSteadyState) {
  auto tier = OpenTier(Options(/*keep=*/2));
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->KeepSpare(0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(tier->KeepSpare(kSize).ok());
  EXPECT_EQ(tier->stats().free_segments, 1u);
  EXPECT_EQ(tier->stats().spare_segments, 1u);
  ASSERT_TRUE(tier->KeepSpare(kSize).ok());  // a free one fits: nothing new
  EXPECT_EQ(tier->stats().spare_segments, 1u);
  for (uint64_t v = 1; v <= 4; ++v) {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_TRUE(lease->recycled()) << "version " << v;
    testing::FillPattern(lease->data(), v);
    ASSERT_TRUE(tier->Commit(std::move(*lease), "m", v).ok());
    ASSERT_TRUE(tier->KeepSpare(kSize).ok());  // what the publisher does after each commit
  }
  HostTierStats s = tier->stats();
  EXPECT_EQ(s.fresh_allocations, 0u);
  EXPECT_EQ(s.recycled_allocations, 4u);
  // keep_versions + 1 segments of this size: 2 committed + the free one for the next version.
  EXPECT_EQ(s.spare_segments, 3u);
  EXPECT_EQ(s.committed_segments + s.free_segments, 3u);
  auto read = tier->Acquire("m", 4);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(SameBytes(read->data(), Pattern(4)));
}

// Allocate and KeepSpare from two threads (the producer and the publisher's spare thread): every
// lease is usable and distinct, and the tier never holds more than keep_versions + 2 segments.
TEST(HostTier, AllocateAndKeepSpareConcurrently) {
  auto tier = OpenTier(Options(/*keep=*/2));
  ASSERT_TRUE(tier);
  std::atomic<bool> stop{false};
  std::thread spare([&] {
    while (!stop) {
      Status st = tier->KeepSpare(kSize);
      if (!st.ok()) ADD_FAILURE() << st.ToString();
    }
  });
  for (uint64_t v = 1; v <= 50; ++v) {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    testing::FillPattern(lease->data(), v);
    ASSERT_TRUE(tier->Commit(std::move(*lease), "m", v).ok());
    auto read = tier->Acquire("m", v);
    ASSERT_TRUE(read.ok());
    EXPECT_TRUE(SameBytes(read->data(), Pattern(v))) << "version " << v;
  }
  stop = true;
  spare.join();
  HostTierStats s = tier->stats();
  EXPECT_LE(s.committed_segments + s.free_segments + s.writing_segments, 4u);
  EXPECT_EQ(s.committed_segments, 2u);
}

TEST(HostTier, RecyclingReusesARetiredSegment) {
  auto tier = OpenTier(Options(/*keep=*/2));
  ASSERT_TRUE(tier);
  std::string first = Publish(*tier, "m", 1, 1);
  Publish(*tier, "m", 2, 2);
  Publish(*tier, "m", 3, 3);  // retires version 1
  EXPECT_EQ(tier->versions("m"), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(tier->stats().free_segments, 1u);

  auto lease = tier->Allocate(kSize);
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(lease->recycled());
  EXPECT_EQ(lease->segment_name(), first);
  EXPECT_EQ(tier->stats().recycled_allocations, 1u);

  // A slightly smaller version fits the same segment too; a much smaller one gets a fresh one.
  lease = WriteLease();
  auto smaller = tier->Allocate(kSize - 4096);
  ASSERT_TRUE(smaller.ok());
  EXPECT_TRUE(smaller->recycled());
  EXPECT_EQ(smaller->segment_name(), first);
  smaller = WriteLease();
  auto tiny = tier->Allocate(4096);
  ASSERT_TRUE(tiny.ok());
  EXPECT_FALSE(tiny->recycled()) << "a 4 KiB version must not pin a 1 MiB segment";
}

TEST(HostTier, NeverRecyclesALeasedSegment) {
  auto tier = OpenTier(Options(/*keep=*/2));
  ASSERT_TRUE(tier);
  std::string leased_name = Publish(*tier, "m", 1, 100);
  auto held = tier->Acquire("m", 1);
  ASSERT_TRUE(held.ok());
  ReadLease copy = *held;  // copies share one hold

  // Publish well past retention: version 1 is retired, but its segment must stay untouched.
  for (uint64_t v = 2; v <= 8; ++v) {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok());
    EXPECT_NE(lease->segment_name(), leased_name) << "leased segment handed out for version " << v;
    testing::FillPattern(lease->data(), 100 + v);
    ASSERT_TRUE(tier->Commit(std::move(*lease), "m", v).ok());
  }
  EXPECT_TRUE(SameBytes(copy.data(), Pattern(100))) << "leased bytes changed";
  EXPECT_EQ(tier->stats().retired_leased_segments, 1u);
  auto gone = tier->Acquire("m", 1);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("versions held: 7, 8"), std::string::npos) << gone.status().message();

  held = ReadLease();
  EXPECT_EQ(tier->stats().retired_leased_segments, 1u) << "a copy still holds it";
  copy = ReadLease();
  HostTierStats s = tier->stats();
  EXPECT_EQ(s.retired_leased_segments, 0u);

  // Now it is recyclable: draining the free pool hands it out.
  std::vector<WriteLease> drained;
  bool seen = false;
  for (size_t i = 0; i < s.free_segments; ++i) {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->recycled());
    seen = seen || lease->segment_name() == leased_name;
    drained.push_back(std::move(*lease));
  }
  EXPECT_TRUE(seen) << "the released segment was not returned to the pool";
}

// An older version loaded back (from the file tier, for a consumer on this host): not listed, not
// subject to retention or the "newer than the latest" rule, never recycled while held, free after.
TEST(HostTier, CommitDetachedHoldsAnOlderVersionUntilItsLastLeaseGoes) {
  auto tier = OpenTier(Options(/*keep=*/1));
  ASSERT_TRUE(tier);
  Publish(*tier, "m", 5, 5);
  auto lease = tier->Allocate(kSize);
  ASSERT_TRUE(lease.ok());
  testing::FillPattern(lease->data(), 2);
  const std::string name = lease->segment_name();
  auto held = tier->CommitDetached(std::move(*lease), "m", 2);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->segment_name(), name);
  EXPECT_EQ(held->version(), 2u);
  EXPECT_EQ(tier->versions("m"), (std::vector<uint64_t>{5})) << "a detached copy is not one of the tier's versions";
  EXPECT_EQ(tier->Acquire("m", 2).status().code(), StatusCode::kNotFound);
  for (uint64_t v = 6; v <= 9; ++v) {
    std::string used = Publish(*tier, "m", v, v);
    EXPECT_NE(used, name) << "the held detached segment was recycled for version " << v;
  }
  EXPECT_TRUE(SameBytes(held->data(), Pattern(2)));
  auto mapped = MapSegmentReadOnly(name, kSize);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_TRUE(SameBytes(mapped->data, Pattern(2)));
  const size_t free_before = tier->stats().free_segments;
  *held = ReadLease();
  EXPECT_EQ(tier->stats().free_segments, free_before + 1) << "the last lease's release frees the segment";
  EXPECT_EQ(tier->CommitDetached(WriteLease(), "m", 3).status().code(), StatusCode::kInvalidArgument);
  auto bad = tier->Allocate(kSize);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(tier->CommitDetached(std::move(*bad), "m", 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostTier, RetentionKeepsTheLatestK) {
  HostTierOptions o = Options(/*keep=*/3);
  auto tier = OpenTier(o);
  ASSERT_TRUE(tier);
  for (uint64_t v = 1; v <= 6; ++v) Publish(*tier, "a", v, v);
  Publish(*tier, "b", 1, 50);
  EXPECT_EQ(tier->versions("a"), (std::vector<uint64_t>{4, 5, 6}));
  EXPECT_EQ(tier->versions("b"), (std::vector<uint64_t>{1}));
  for (uint64_t v = 4; v <= 6; ++v) {
    auto lease = tier->Acquire("a", v);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(SameBytes(lease->data(), Pattern(v)));
  }
  EXPECT_EQ(tier->Acquire("a", 3).status().code(), StatusCode::kNotFound);
  HostTierStats s = tier->stats();
  EXPECT_EQ(s.committed_segments, 4u);
  EXPECT_EQ(s.fresh_allocations, 4u) << "versions 5, 6 and b/1 reuse retired segments";
  EXPECT_EQ(ShmEntries(o.prefix).size(), s.committed_segments + s.free_segments);
}

TEST(HostTier, TheFreePoolIsTrimmedToMaxFreeSegments) {
  HostTierOptions o = Options();
  o.max_free_segments = 1;
  auto tier = OpenTier(o);
  ASSERT_TRUE(tier);
  {
    std::vector<WriteLease> leases;
    for (int i = 0; i < 4; ++i) leases.push_back(std::move(tier->Allocate(kSize).value()));
  }  // four aborted writes
  HostTierStats s = tier->stats();
  EXPECT_EQ(s.free_segments, 1u);
  EXPECT_EQ(ShmEntries(o.prefix).size(), 1u) << "trimmed segments are unlinked";
}

TEST(HostTier, SegmentsAreOwnerOnlyWhateverTheUmask) {
  mode_t old = ::umask(0);  // a permissive umask must not widen the segment
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  std::string name = Publish(*tier, "m", 1, 1);
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, ::getuid());

  ::umask(0077);  // a strict umask must not narrow a configured mode
  HostTierOptions o = Options();
  o.mode = 0640;
  auto shared = OpenTier(o);
  ASSERT_TRUE(shared);
  name = Publish(*shared, "m", 1, 1);
  ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  ::umask(old);
}

// Forks a child that creates a tier with `prefix`, commits two versions, reports its segment
// names through a pipe and then waits to be killed.
pid_t SpawnProducer(const std::string& prefix, std::vector<std::string>* names) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    HostTierOptions o;
    o.prefix = prefix;
    auto tier = HostTier::Open(o);
    if (!tier.ok()) ::_exit(3);
    std::string out;
    for (uint64_t v = 1; v <= 2; ++v) {
      auto lease = (*tier)->Allocate(kSize);
      if (!lease.ok()) ::_exit(4);
      out += lease->segment_name() + "\n";
      if (!(*tier)->Commit(std::move(*lease), "m", v).ok()) ::_exit(5);
    }
    out += "ready\n";
    if (::write(fds[1], out.data(), out.size()) != static_cast<ssize_t>(out.size())) ::_exit(6);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while (text.find("ready\n") == std::string::npos && (n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, n);
  ::close(fds[0]);
  for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    std::string line = text.substr(pos, nl - pos);
    if (line != "ready") names->push_back(line);
  }
  return pid;
}

TEST(HostTier, OpenRemovesSegmentsOfAKilledProcessButNotOfALiveOne) {
  const std::string prefix = UniqueName("vst");
  std::vector<std::string> dead_names, live_names;
  pid_t dead = SpawnProducer(prefix, &dead_names);
  pid_t live = SpawnProducer(prefix, &live_names);
  ASSERT_GT(dead, 0);
  ASSERT_GT(live, 0);
  ASSERT_EQ(dead_names.size(), 2u);
  ASSERT_EQ(live_names.size(), 2u);
  ASSERT_EQ(::kill(dead, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  ASSERT_TRUE(WIFSIGNALED(status));
  for (const auto& n : dead_names) EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + n)) << n;

  std::vector<std::string> stale = HostTier::FindStaleSegments(prefix);
  std::sort(dead_names.begin(), dead_names.end());
  EXPECT_EQ(stale, dead_names);

  HostTierOptions o;
  o.prefix = prefix;
  ::testing::internal::CaptureStderr();
  auto tier = OpenTier(o);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(tier);
  for (const auto& n : dead_names) {
    EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + n)) << n;
    EXPECT_NE(log.find(n), std::string::npos) << "no warning names " << n << ": " << log;
  }
  for (const auto& n : live_names) EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + n)) << n;

  ::kill(live, SIGKILL);
  ::waitpid(live, &status, 0);
  tier.reset();
  tier = OpenTier(o);  // now the second producer's segments are stale too
  EXPECT_TRUE(ShmEntries(prefix).empty());
}

TEST(HostTier, CleanDestructionLeavesNothingInDevShm) {
  HostTierOptions o = Options(/*keep=*/1);
  {
    auto tier = OpenTier(o);
    ASSERT_TRUE(tier);
    for (uint64_t v = 1; v <= 4; ++v) Publish(*tier, "m", v, v);  // committed + free segments
    auto writing = tier->Allocate(3 * kSize);                       // a segment being written
    ASSERT_TRUE(writing.ok());
    EXPECT_FALSE(ShmEntries(o.prefix).empty());
  }
  EXPECT_TRUE(ShmEntries(o.prefix).empty());
}

TEST(HostTier, AbortedWriteLeaseReturnsTheSegment) {
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  std::string name;
  {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok());
    name = lease->segment_name();
    EXPECT_EQ(tier->stats().writing_segments, 1u);
  }  // dropped without Commit
  HostTierStats s = tier->stats();
  EXPECT_EQ(s.writing_segments, 0u);
  EXPECT_EQ(s.free_segments, 1u);
  EXPECT_FALSE(tier->latest("m").has_value()) << "an aborted publish must leave nothing visible";
  auto again = tier->Allocate(kSize);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->recycled());
  EXPECT_EQ(again->segment_name(), name);

  // Move-assigning over a live lease aborts the overwritten one.
  auto other = tier->Allocate(kSize);
  ASSERT_TRUE(other.ok());
  *other = std::move(*again);
  EXPECT_EQ(tier->stats().writing_segments, 1u);
  EXPECT_EQ(tier->stats().free_segments, 1u);
}

TEST(HostTier, ChildProcessMapsTheSegmentReadOnly) {
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  std::string name = Publish(*tier, "m", 1, 42);
  const uint64_t expected = checksum64(Pattern(42));
  pid_t pid = ::fork();
  if (pid == 0) {
    auto mapped = MapSegmentReadOnly(name, kSize);
    if (!mapped.ok()) ::_exit(2);
    ::_exit(checksum64(mapped->data) == expected ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: map failed, 1: bytes differ";
}

TEST(HostTier, MapSegmentReadOnlyErrorsAreClear) {
  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  std::string name = Publish(*tier, "m", 1, 1);
  auto big = MapSegmentReadOnly(name, 1ull << 40);
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("smaller than"), std::string::npos) << big.status().message();
  auto missing = MapSegmentReadOnly(name + "9999", kSize);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_EQ(MapSegmentReadOnly("a/b", kSize).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MapSegmentReadOnly("", kSize).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MapSegmentReadOnly(name, 0).status().code(), StatusCode::kInvalidArgument);
  auto mapped = MapSegmentReadOnly(name, kSize);
  ASSERT_TRUE(mapped.ok());
  EXPECT_TRUE(SameBytes(mapped->data, Pattern(1)));
}

TEST(HostTier, BadArgumentsGiveClearErrors) {
  HostTierOptions bad = Options();
  bad.prefix = "a.b";
  EXPECT_NE(HostTier::Open(bad).status().message().find("prefix"), std::string::npos);
  bad = Options();
  bad.keep_versions = 0;
  EXPECT_EQ(HostTier::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = Options();
  bad.mode = 0400;
  EXPECT_EQ(HostTier::Open(bad).status().code(), StatusCode::kInvalidArgument);

  auto tier = OpenTier(Options());
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  for (const std::string& model : std::vector<std::string>{"", "../etc", ".hidden", "a/b", std::string(129, 'x'), std::string("a\0b", 3)}) {
    auto lease = tier->Allocate(kSize);
    ASSERT_TRUE(lease.ok());
    Status st = tier->Commit(std::move(*lease), model, 1);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << model;
    EXPECT_NE(st.message().find("model name"), std::string::npos) << st.message();
  }
  auto lease = tier->Allocate(kSize);
  ASSERT_TRUE(lease.ok());
  Status st = tier->Commit(std::move(*lease), "m", 0);
  EXPECT_NE(st.message().find("version 0"), std::string::npos) << st.message();
  EXPECT_EQ(tier->stats().writing_segments, 0u) << "a refused commit returns the segment";

  Publish(*tier, "m", 5, 5);
  lease = tier->Allocate(kSize);
  ASSERT_TRUE(lease.ok());
  st = tier->Commit(std::move(*lease), "m", 5);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("not newer"), std::string::npos) << st.message();
  EXPECT_EQ(tier->Commit(WriteLease(), "m", 6).code(), StatusCode::kInvalidArgument);

  auto other = OpenTier(Options());
  ASSERT_TRUE(other);
  auto foreign = other->Allocate(kSize);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(tier->Commit(std::move(*foreign), "m", 6).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->Acquire("m", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->Acquire("../m", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostTier, AReadLeaseMayOutliveTheTier) {
  HostTierOptions o = Options();
  ReadLease lease;
  {
    auto tier = OpenTier(o);
    ASSERT_TRUE(tier);
    Publish(*tier, "m", 1, 9);
    auto acquired = tier->Acquire("m", 1);
    ASSERT_TRUE(acquired.ok());
    lease = *acquired;
  }
  EXPECT_TRUE(ShmEntries(o.prefix).empty()) << "the name goes with the tier";
  EXPECT_TRUE(SameBytes(lease.data(), Pattern(9))) << "the mapping stays with the lease";
}

// Readers hold leases on the latest version while a producer keeps publishing into recycled
// segments: a reader must never see its bytes change.
TEST(HostTier, ConcurrentReadersNeverSeeTheirVersionOverwritten) {
  HostTierOptions o = Options(/*keep=*/2);
  auto tier = OpenTier(o);
  ASSERT_TRUE(tier);
  constexpr uint64_t kSmall = 64 << 10;
  constexpr uint64_t kVersions = 300;
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::atomic<int> reads{0};
  auto reader = [&] {
    while (!done.load()) {
      auto v = tier->latest("m");
      if (!v) continue;
      auto lease = tier->Acquire("m", *v);
      if (!lease.ok()) continue;  // retired between latest() and Acquire(): fine
      auto first = lease->data()[0];
      for (int pass = 0; pass < 3; ++pass) {
        for (std::byte b : lease->data()) bad += (b != first);
      }
      if (first != std::byte(static_cast<uint8_t>(*v))) ++bad;
      ++reads;
    }
  };
  std::thread r1(reader), r2(reader);
  // Publish at least kVersions, and on until the readers have read a fair number of versions.
  for (uint64_t v = 1; v <= kVersions || (reads.load() < 100 && v < 200000); ++v) {
    auto lease = tier->Allocate(kSmall);
    if (!lease.ok()) {
      ADD_FAILURE() << lease.status().ToString();
      break;
    }
    std::memset(lease->data().data(), static_cast<int>(v & 0xff), kSmall);
    Status st = tier->Commit(std::move(*lease), "m", v);
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      break;
    }
  }
  done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  HostTierStats s = tier->stats();
  EXPECT_GT(s.recycled_allocations, kVersions / 2) << "steady state should recycle";
  EXPECT_EQ(s.retired_leased_segments, 0u);
}

}  // namespace
}  // namespace viper
