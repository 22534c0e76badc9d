// The prefetcher with real files and real threads: every sample once per epoch, orders, labels,
// bad and truncated files (fail with the sample's name, or skip and count), the memory cap,
// closing mid-epoch with a consumer blocked or gone, and the tuner moving within its caps.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "viper/prefetch.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::MakeSampleTree;
using testing::SampleBytes;
using testing::TempDir;

std::shared_ptr<const SampleSource> Tree(const TempDir& dir, int classes, int per_class, size_t size,
                                         DirectorySourceOptions o = {}) {
  MakeSampleTree(dir.path(), classes, per_class, size);
  o.dir = dir.path();
  auto src = OpenDirectorySource(o);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  return src.ok() ? *src : nullptr;
}

std::unique_ptr<Prefetcher> StartOrDie(std::shared_ptr<const SampleSource> src, const PrefetchOptions& o) {
  auto p = Prefetcher::Start(std::move(src), o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// One epoch's samples (checking the bytes of each against the source's pattern).
std::vector<Sample> Epoch(Prefetcher& p, size_t size) {
  std::vector<Sample> out;
  while (true) {
    auto s = p.Next();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok() || !s->has_value()) break;
    Sample& x = **s;
    EXPECT_EQ(x.bytes.size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.bytes.data()) % 64, 0u);
    EXPECT_EQ(0, std::memcmp(x.bytes.data(), SampleBytes(x.id, size).data(), size)) << "sample " << x.id;
    out.push_back(std::move(x));
  }
  return out;
}

// A real source behind a gate or a delay: reads wait (as on slow storage) without burning CPU.
class SlowSource : public SampleSource {
 public:
  SlowSource(std::shared_ptr<const SampleSource> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  uint64_t size() const override { return inner_->size(); }
  uint64_t bytes(uint64_t id) const override { return inner_->bytes(id); }
  int64_t label(uint64_t id) const override { return inner_->label(id); }
  std::string Describe(uint64_t id) const override { return inner_->Describe(id); }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    reads_in_progress++;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // A closed gate holds the read (at most 60 s, so that a broken test cannot hang CTest).
      cv_.wait_for(lk, 60s, [&] { return open_; });
    }
    std::this_thread::sleep_for(delay_);
    reads_in_progress--;
    return inner_->ReadInto(id, dst);
  }
  void Gate(bool open) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = open;
    }
    cv_.notify_all();
  }
  mutable std::atomic<int> reads_in_progress{0};

 private:
  std::shared_ptr<const SampleSource> inner_;
  std::chrono::milliseconds delay_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = true;
};

TEST(PrefetchTest, EverySampleOncePerEpochWithLabels) {
  TempDir dir;
  auto src = Tree(dir, 3, 20, 1000);
  ASSERT_EQ(src->class_names(), (std::vector<std::string>{"c0", "c1", "c2"}));
  auto p = StartOrDie(src, {.epochs = 3, .seed = 7, .readers = 4, .buffer_samples = 8});
  std::vector<std::vector<uint64_t>> orders;
  for (int e = 0; e < 3; ++e) {
    auto samples = Epoch(*p, 1000);
    std::set<uint64_t> ids;
    std::vector<uint64_t> order;
    for (const auto& s : samples) {
      EXPECT_EQ(s.epoch, static_cast<uint64_t>(e));
      EXPECT_EQ(s.label, static_cast<int64_t>(s.id / 20));
      ids.insert(s.id);
      order.push_back(s.id);
    }
    EXPECT_EQ(ids.size(), 60u) << "epoch " << e;
    EXPECT_EQ(samples.size(), 60u);
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_TRUE(p->finished());
  auto after = p->Next();
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
  EXPECT_EQ(p->stats().delivered, 180u);
}

TEST(PrefetchTest, OrderedDeliveryIsTheSeededPermutation) {
  TempDir dir;
  auto src = Tree(dir, 2, 25, 300);
  auto run = [&](uint64_t seed) {
    auto p = StartOrDie(src, {.seed = seed, .ordered = true, .readers = 5, .buffer_samples = 10});
    std::vector<uint64_t> order;
    for (const auto& s : Epoch(*p, 300)) {
      EXPECT_EQ(s.position, order.size());
      order.push_back(s.id);
    }
    return order;
  };
  auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a.size(), 50u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto p = StartOrDie(src, {.shuffle = false, .ordered = true, .ids = {4, 2, 9}});
  std::vector<uint64_t> order;
  for (const auto& s : Epoch(*p, 300)) order.push_back(s.id);
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 2, 9}));
}

TEST(PrefetchTest, RecordFileSource) {
  TempDir dir;
  auto path = dir.path() / "data.vrec";
  testing::MakeRecordFile(path, 64, [](uint64_t) { return 512; }, 4);
  auto src = OpenRecordSource(path);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto p = StartOrDie(*src, {.epochs = 2, .readers = 3});
  for (int e = 0; e < 2; ++e) {
    auto samples = Epoch(*p, 512);
    ASSERT_EQ(samples.size(), 64u);
    for (const auto& s : samples) EXPECT_EQ(s.label, static_cast<int64_t>(s.id % 4));
  }
}

// Damage two files after the scan: one truncated, one removed.
void Damage(const TempDir& dir) {
  ASSERT_EQ(::truncate((dir.path() / "c0/000003.bin").c_str(), 100), 0);
  std::filesystem::remove(dir.path() / "c1/000002.bin");
}

TEST(PrefetchTest, BadFileFailsNamingTheSample) {
  TempDir dir;
  auto src = Tree(dir, 2, 10, 1000);
  Damage(dir);
  auto p = StartOrDie(src, {.shuffle = false, .ordered = true, .readers = 3});
  Status failure;
  int good = 0;
  while (true) {
    auto s = p->Next(30s);
    if (!s.ok()) {
      failure = s.status();
      break;
    }
    ASSERT_TRUE(s->has_value()) << "the epoch ended without the damaged samples failing";
    good++;
  }
  EXPECT_EQ(good, 3) << "samples 0-2 come before the truncated sample 3";
  EXPECT_EQ(failure.code(), StatusCode::kCorruption);
  EXPECT_EQ(failure.message(), "sample 3 (" + (dir.path() / "c0/000003.bin").string() +
                                   "): truncated: the file is 100 bytes now, 1000 at the scan");
  auto again = p->Next();
  EXPECT_EQ(again.status().message(), failure.message()) << "a failed prefetcher keeps failing";
}

// A sample replaced by a FIFO after the scan fails at once, naming it (opening a FIFO for reading
// used to wait for a writer, and the reader with it).
TEST(PrefetchTest, SampleReplacedByAFifoFailsWithoutWaiting) {
  TempDir dir;
  auto src = Tree(dir, 1, 4, 1000);
  const auto sample = dir.path() / "c0/000001.bin";
  std::filesystem::remove(sample);
  ASSERT_EQ(::mkfifo(sample.c_str(), 0600), 0) << std::strerror(errno);
  auto p = StartOrDie(src, {.shuffle = false, .ordered = true, .readers = 1});
  ASSERT_TRUE(p->Next(30s).ok());
  auto s = p->Next(30s);
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption) << s.status().ToString();
  EXPECT_EQ(s.status().message(), "sample 1 (" + sample.string() + "): no longer a regular file");
}

TEST(PrefetchTest, BadFilesSkippedAndCounted) {
  TempDir dir;
  auto src = Tree(dir, 2, 10, 1000);
  Damage(dir);
  auto p = StartOrDie(src, {.epochs = 2, .readers = 3, .on_error = OnError::kSkip});
  for (int e = 0; e < 2; ++e) {
    std::set<uint64_t> ids;
    for (const auto& s : Epoch(*p, 1000)) ids.insert(s.id);
    EXPECT_EQ(ids.size(), 18u);
    EXPECT_FALSE(ids.count(3) || ids.count(12));
  }
  auto st = p->stats();
  EXPECT_EQ(st.skipped, 4u);
  EXPECT_EQ(st.delivered, 36u);
  EXPECT_NE(st.last_skip_error.find("sample "), std::string::npos) << st.last_skip_error;
}

TEST(PrefetchTest, WrongSizeAndMissingNameTheSample) {
  TempDir dir;
  auto src = Tree(dir, 1, 4, 1000, {.sample_bytes = 1000});
  testing::WriteFile(dir.path() / "c0/000001.bin", SampleBytes(1, 999));
  src = OpenDirectorySource({.dir = dir.path(), .sample_bytes = 1000}).value();
  auto p = StartOrDie(src, {.shuffle = false, .ordered = true, .readers = 1});
  ASSERT_TRUE(p->Next().ok());
  auto s = p->Next();
  EXPECT_EQ(s.status().message(), "sample 1 (" + (dir.path() / "c0/000001.bin").string() +
                                      "): 999 bytes at the scan, expected 1000 (DirectorySourceOptions.sample_bytes)");
  std::filesystem::remove(dir.path() / "c0/000002.bin");
  p = StartOrDie(src, {.shuffle = false, .ordered = true, .ids = {2}});
  EXPECT_EQ(p->Next().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(OpenDirectorySource({.dir = dir.path() / "none"}).status().code(), StatusCode::kNotFound);
}

TEST(PrefetchTest, CloseWakesABlockedConsumerWhileAReadIsStuck) {
  TempDir dir;
  auto slow = std::make_shared<SlowSource>(Tree(dir, 1, 10, 100), 0ms);
  slow->Gate(false);
  auto p = StartOrDie(slow, {.readers = 2, .autotune = false});
  EXPECT_EQ(p->Next(50ms).status().code(), StatusCode::kTimeout);
  auto consumer = std::async(std::launch::async, [&] { return p->Next().status(); });
  while (slow->reads_in_progress < 2) std::this_thread::sleep_for(1ms);
  auto closer = std::async(std::launch::async, [&] { p->Close(); });
  ASSERT_EQ(consumer.wait_for(30s), std::future_status::ready) << "Close did not wake the consumer";
  EXPECT_EQ(consumer.get().code(), StatusCode::kCancelled);
  slow->Gate(true);  // the reads in progress finish; then Close joins the readers
  ASSERT_EQ(closer.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(p->Next().status().code(), StatusCode::kCancelled);
}

TEST(PrefetchTest, ConsumerThatStopsMidEpoch) {
  TempDir dir;
  auto src = Tree(dir, 1, 200, 100);
  for (bool autotune : {false, true}) {
    auto p = StartOrDie(src, {.epochs = 0, .readers = 4, .buffer_samples = 8, .autotune = autotune,
                              .tune_interval = 10ms});
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->Next().ok());
    std::this_thread::sleep_for(100ms);  // readers fill the buffer and block
    EXPECT_LE(p->stats().ready, p->stats().buffer_samples);
    auto t0 = std::chrono::steady_clock::now();
    p.reset();  // the destructor closes
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  }
}

TEST(PrefetchTest, MemoryCapHolds) {
  TempDir dir;
  auto src = Tree(dir, 1, 100, 10000);
  auto p = StartOrDie(src, {.readers = 8, .buffer_samples = 64, .max_buffer_bytes = 50000});
  // The readers read ahead before the first sample is taken (waited for, with a deadline, not
  // left to how the readers and the consumer below happen to be scheduled).
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (p->stats().buffered_bytes < 30000 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
  size_t n = 0;
  while (true) {
    auto s = p->Next();
    ASSERT_TRUE(s.ok());
    if (!s->has_value()) break;
    if (++n % 10 == 0) std::this_thread::sleep_for(2ms);  // let the readers fill up
  }
  EXPECT_EQ(n, 100u);
  EXPECT_LE(p->stats().peak_buffered_bytes, 50000u);
  EXPECT_GE(p->stats().peak_buffered_bytes, 30000u) << "the readers did read ahead";
  // A sample larger than the cap is still read, alone.
  p = StartOrDie(src, {.readers = 4, .max_buffer_bytes = 5000});
  EXPECT_EQ(Epoch(*p, 10000).size(), 100u);
  EXPECT_EQ(p->stats().peak_buffered_bytes, 10000u);
}

// A data service's per-job budget changed at run time: fewer readers at once, the byte cap for every
// read claimed after it (what was read ahead before drains), bad budgets refused.
TEST(PrefetchTest, SetLimitsMovesReadersAndTheByteCap) {
  TempDir dir;
  auto src = Tree(dir, 1, 200, 10000);
  auto p = StartOrDie(src, {.epochs = 0, .readers = 4, .buffer_samples = 64, .autotune = false,
                            .max_readers = 4, .max_buffer_bytes = 400000});
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (p->stats().buffered_bytes < 300000 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
  EXPECT_GE(p->stats().buffered_bytes, 300000u) << "the readers read ahead up to the cap";
  ASSERT_TRUE(p->SetLimits(1, 50000).ok());
  EXPECT_EQ(p->stats().readers, 1u);
  EXPECT_EQ(p->stats().max_readers, 1u);
  EXPECT_EQ(p->stats().max_buffer_bytes, 50000u);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(p->Next().ok());  // take what was read ahead under the old cap
  std::this_thread::sleep_for(50ms);
  EXPECT_LE(p->stats().buffered_bytes, 50000u);
  ASSERT_TRUE(p->SetLimits(3, 1 << 20).ok());
  EXPECT_EQ(p->stats().readers, 3u) << "without the tuner the reader count is the budget";
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(p->Next().ok());
  EXPECT_EQ(p->SetLimits(0, 1000).message(), "max_readers must be in [1, 1024], got 0");
  EXPECT_EQ(p->SetLimits(1, 0).code(), StatusCode::kInvalidArgument);
}

// Readers above the budget park; the one reader left must still be woken for every sample the
// consumer takes. With a one-sample byte cap it waits after each read, so a wake-up that reached a
// parked reader instead (lost: that reader goes back to sleep) left the consumer waiting forever,
// as a data service's job did after its budget went from 4 readers to 1.
TEST(PrefetchTest, TheReadersLeftAfterABudgetCutAreWokenForEverySample) {
  TempDir dir;
  auto src = Tree(dir, 1, 50, 1000);
  for (int round = 0; round < 10; ++round) {
    auto p = StartOrDie(src, {.epochs = 0, .readers = 16, .buffer_samples = 64, .autotune = false,
                              .max_readers = 16, .max_buffer_bytes = 1 << 20});
    ASSERT_TRUE(p->Next().ok());
    ASSERT_TRUE(p->SetLimits(1, 1000).ok());  // one reader, one sample read ahead at a time
    for (int i = 0; i < 200; ++i) {
      auto s = p->Next(5s);
      ASSERT_TRUE(s.ok()) << "round " << round << ", sample " << i << ": " << s.status().ToString();
    }
  }
}

TEST(PrefetchTest, NextBatchStopsAtTheEpoch) {
  TempDir dir;
  auto src = Tree(dir, 1, 10, 64);
  auto p = StartOrDie(src, {.epochs = 2});
  for (int e = 0; e < 2; ++e) {
    auto a = p->NextBatch(4), b = p->NextBatch(4), c = p->NextBatch(4), end = p->NextBatch(4);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok() && end.ok());
    EXPECT_EQ(a->size(), 4u);
    EXPECT_EQ(c->size(), 2u);
    EXPECT_TRUE(end->empty());
  }
  EXPECT_TRUE(p->finished());
}

TEST(PrefetchTest, OptionsAreChecked) {
  TempDir dir;
  auto src = Tree(dir, 1, 3, 64);
  EXPECT_EQ(Prefetcher::Start(src, {.readers = 0}).status().message(),
            "PrefetchOptions: readers must be in [1, max_readers = 32], got 0");
  EXPECT_EQ(Prefetcher::Start(src, {.ids = {3}}).status().message(),
            "PrefetchOptions: id 3 is out of range: the source has 3 samples");
  EXPECT_EQ(Prefetcher::Start(src, {.buffer_samples = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Prefetcher::Start(nullptr, {}).status().code(), StatusCode::kInvalidArgument);
}

// Storage with 10 ms per read and a consumer that never waits on its own: one reader cannot keep
// up, so the tuner must add readers, and never more than max_readers.
TEST(PrefetchTest, TunerAddsReadersWithinTheCap) {
  TempDir dir;
  auto slow = std::make_shared<SlowSource>(Tree(dir, 1, 400, 256), 10ms);
  auto p = StartOrDie(slow, {.epochs = 0, .readers = 1, .buffer_samples = 2, .max_readers = 6,
                             .max_buffer_samples = 64, .tune_interval = 50ms});
  // At least 2 s (the cap must hold while it climbs), then until it has climbed to 3 readers: a
  // sanitizer build on a loaded machine measures noisy rates and may take longer (up to 20 s).
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::steady_clock::now() - t0; };
  while (elapsed() < 2s || (p->stats().readers < 3 && elapsed() < 20s)) ASSERT_TRUE(p->Next().ok());
  auto st = p->stats();
  ASSERT_FALSE(st.tuner.empty());
  for (const auto& e : st.tuner) {
    EXPECT_LE(e.readers, 6u) << e.reason;
    EXPECT_LE(e.buffer_samples, 64u) << e.reason;
  }
  EXPECT_GE(st.readers, 3u) << st.tuner.back().reason;
}

// A budget changed under a starving consumer: the tuner climbs only to the new cap, and past the old
// one once the cap is raised (a data service job's readers, set at run time).
TEST(PrefetchTest, TunerWorksWithinABudgetChangedAtRunTime) {
  TempDir dir;
  auto slow = std::make_shared<SlowSource>(Tree(dir, 1, 400, 256), 10ms);
  auto p = StartOrDie(slow, {.epochs = 0, .readers = 1, .buffer_samples = 2, .max_readers = 8,
                             .max_buffer_samples = 64, .tune_interval = 50ms});
  ASSERT_TRUE(p->SetLimits(2, 1 << 20).ok());
  // At least 1.5 s at the budget, and until it has climbed to it (up to 20 s on a slow machine).
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::steady_clock::now() - t0; };
  size_t most = 0;
  while (elapsed() < 1500ms || (most < 2 && elapsed() < 20s)) {
    ASSERT_TRUE(p->Next().ok());
    most = std::max(most, p->stats().readers);
  }
  EXPECT_EQ(most, 2u) << "the starving consumer makes the tuner climb, to the budget and no further";
  size_t events = p->stats().tuner.size();
  ASSERT_TRUE(p->SetLimits(6, 1 << 20).ok());
  t0 = std::chrono::steady_clock::now();
  while (elapsed() < 2s || (p->stats().readers < 3 && elapsed() < 20s)) ASSERT_TRUE(p->Next().ok());
  auto st = p->stats();
  EXPECT_GE(st.readers, 3u) << "a raised budget lets it climb on";
  for (size_t i = events; i < st.tuner.size(); ++i) EXPECT_LE(st.tuner[i].readers, 6u) << st.tuner[i].reason;
}

// Fast storage and a slow consumer: the tuner gives readers and buffer slots back.
TEST(PrefetchTest, TunerGivesBackWhatTheConsumerDoesNotNeed) {
  TempDir dir;
  auto src = Tree(dir, 1, 300, 256);
  auto p = StartOrDie(src, {.epochs = 0, .readers = 8, .buffer_samples = 64, .tune_interval = 30ms});
  // At least 2.5 s of the slow consumer; then on until both came down, for a tuner that runs late
  // on a loaded machine (20 s at most: a tuner that never gives back still fails).
  auto t0 = std::chrono::steady_clock::now();
  auto gave_back = [&] { return p->stats().readers < 8 && p->stats().buffer_samples < 64; };
  while (std::chrono::steady_clock::now() - t0 < 2500ms || (!gave_back() && std::chrono::steady_clock::now() - t0 < 20s)) {
    ASSERT_TRUE(p->Next().ok());
    std::this_thread::sleep_for(2ms);
  }
  auto st = p->stats();
  ASSERT_FALSE(st.tuner.empty());
  EXPECT_LT(st.readers, 8u) << st.tuner.back().reason;
  EXPECT_LT(st.buffer_samples, 64u) << st.tuner.back().reason;
  EXPECT_GE(st.readers, 1u);
}

}  // namespace
}  // namespace viper
