// The rehearsal buffer: reservoir statistics, class balance, draws, spill and restore (validated),
// and concurrent use.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "data/rehearsal_state.h"
#include "data_test_util.h"
#include "viper/rehearsal.h"

namespace viper {
namespace {

using testing::TempDir;

std::vector<std::byte> IdBytes(uint64_t id) {
  std::vector<std::byte> b(8);
  std::memcpy(b.data(), &id, 8);
  return b;
}
uint64_t IdOf(const RehearsalSample& s) {
  uint64_t id;
  std::memcpy(&id, s.bytes->data(), 8);
  return id;
}

std::unique_ptr<RehearsalBuffer> OpenOrDie(const RehearsalOptions& o) {
  auto b = RehearsalBuffer::Open(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

void AddOrDie(RehearsalBuffer& b, uint64_t id, int64_t label) {
  auto kept = b.Add(IdBytes(id), label);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
}

// Pearson's chi-square statistic of `counts` against a uniform expectation.
double ChiSquare(const std::vector<double>& counts) {
  double total = 0, chi = 0;
  for (double c : counts) total += c;
  double expected = total / static_cast<double>(counts.size());
  for (double c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

TEST(RehearsalTest, ReservoirKeepsEverySampleWithEqualChance) {
  // 3000 runs of a 100-sample stream into 10 slots: each sample is kept in 300 runs on average.
  std::vector<double> kept(100, 0);
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    auto b = OpenOrDie({.capacity = 10, .seed = seed, .sample_bytes = 8});
    for (uint64_t id = 0; id < 100; ++id) AddOrDie(*b, id, -1);
    ASSERT_EQ(b->size(), 10u);
    for (const auto& s : b->Draw(100)) kept[IdOf(s)]++;
  }
  // 99 degrees of freedom: P(chi2 > 148.2) = 0.001 for a uniform sampler. The seeds are fixed, so
  // the test is deterministic; a biased sampler (e.g. favouring late samples) lands far above.
  EXPECT_LT(ChiSquare(kept), 148.2);
  double early = 0, late = 0;
  for (int i = 0; i < 50; ++i) early += kept[i], late += kept[50 + i];
  EXPECT_NEAR(early / late, 1.0, 0.05);
}

TEST(RehearsalTest, DrawIsDistinctAndUniform) {
  auto b = OpenOrDie({.capacity = 20, .seed = 3, .sample_bytes = 8});
  for (uint64_t id = 0; id < 20; ++id) AddOrDie(*b, id, static_cast<int64_t>(id % 2));
  std::vector<double> drawn(20, 0);
  for (int i = 0; i < 4000; ++i) {
    auto d = b->Draw(5);
    ASSERT_EQ(d.size(), 5u);
    std::set<uint64_t> ids;
    for (const auto& s : d) {
      ids.insert(IdOf(s));
      drawn[IdOf(s)]++;
      EXPECT_EQ(s.label, static_cast<int64_t>(IdOf(s) % 2));
    }
    EXPECT_EQ(ids.size(), 5u);
  }
  EXPECT_LT(ChiSquare(drawn), 43.8);  // 19 degrees of freedom, P = 0.001
  EXPECT_EQ(b->Draw(100).size(), 20u);
  std::vector<std::byte> dst(8 * 4);
  std::vector<int64_t> labels(4);
  auto n = b->DrawInto(4, dst, labels);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  for (int i = 0; i < 4; ++i) {
    uint64_t id;
    std::memcpy(&id, &dst[8 * i], 8);
    EXPECT_EQ(labels[i], static_cast<int64_t>(id % 2));
  }
  EXPECT_EQ(b->DrawInto(5, dst, labels).status().code(), StatusCode::kInvalidArgument);
}

TEST(RehearsalTest, DrawOfOneClassIsDistinctAndUniformWithinIt) {
  // 20 samples, ids 0..19, label id % 4: class 1 holds ids 1, 5, 9, 13, 17.
  auto b = OpenOrDie({.capacity = 20, .seed = 4, .sample_bytes = 8});
  for (uint64_t id = 0; id < 20; ++id) AddOrDie(*b, id, static_cast<int64_t>(id % 4));
  std::vector<double> drawn(5, 0);
  for (int i = 0; i < 4000; ++i) {
    auto d = b->Draw(2, 1);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_NE(IdOf(d[0]), IdOf(d[1]));
    for (const auto& s : d) {
      ASSERT_EQ(s.label, 1);
      drawn[IdOf(s) / 4]++;
    }
  }
  EXPECT_LT(ChiSquare(drawn), 18.5);  // 4 degrees of freedom, P = 0.001
  EXPECT_EQ(b->Draw(100, 1).size(), 5u);  // all of the class
  EXPECT_TRUE(b->Draw(3, 7).empty());     // a class it does not hold
  std::vector<std::byte> dst(8 * 3);
  std::vector<int64_t> labels(3);
  auto n = b->DrawInto(3, dst, labels, 2);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(labels, (std::vector<int64_t>{2, 2, 2}));
}

// A stream where class 0 floods, class 1 is rare and class 2 arrives late.
void ImbalancedStream(RehearsalBuffer& b) {
  uint64_t id = 0;
  for (int i = 0; i < 900; ++i) {
    AddOrDie(b, id++, 0);
    if (i % 10 == 0) AddOrDie(b, id++, 1);
  }
  for (int i = 0; i < 30; ++i) AddOrDie(b, id++, 2);
  for (int i = 0; i < 5; ++i) AddOrDie(b, id++, 3);
}

TEST(RehearsalTest, ClassBalancedEvensOutTheClasses) {
  auto b = OpenOrDie({.capacity = 65, .policy = RehearsalPolicy::kClassBalanced, .seed = 5, .sample_bytes = 8});
  ImbalancedStream(*b);
  // Class 3 was seen 5 times and keeps all 5; the other 60 slots split evenly.
  EXPECT_EQ(b->class_counts(), (std::map<int64_t, size_t>{{0, 20}, {1, 20}, {2, 20}, {3, 5}}));
  EXPECT_EQ(b->seen(), 1025u);
  EXPECT_EQ(b->class_seen().at(1), 90u);
  // Reservoir sampling of the same stream keeps the classes in the stream's proportions.
  auto r = OpenOrDie({.capacity = 65, .seed = 5, .sample_bytes = 8});
  ImbalancedStream(*r);
  EXPECT_GT(r->class_counts()[0], 40u);
  EXPECT_LT(r->class_counts()[2], 8u);
}

TEST(RehearsalTest, InputRules) {
  auto b = OpenOrDie({.capacity = 4, .policy = RehearsalPolicy::kClassBalanced, .sample_bytes = 8});
  EXPECT_EQ(b->Add(IdBytes(1), -1).status().message(),
            "rehearsal buffer: label -1 is not allowed (class_balanced needs labels >= 0)");
  EXPECT_EQ(b->Add(std::vector<std::byte>(7), 0).status().message(),
            "rehearsal buffer: sample of 7 bytes, expected 8 (RehearsalOptions.sample_bytes)");
  EXPECT_EQ(RehearsalBuffer::Open({.capacity = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Spill().code(), StatusCode::kFailedPrecondition);
}

TEST(RehearsalTest, SpillAndRestore) {
  TempDir dir;
  RehearsalOptions o{.capacity = 65, .policy = RehearsalPolicy::kClassBalanced, .seed = 5, .sample_bytes = 8,
                     .spill_dir = dir.path() / "rehearsal"};
  std::set<std::pair<uint64_t, int64_t>> before;
  {
    auto b = OpenOrDie(o);
    ImbalancedStream(*b);
    ASSERT_TRUE(b->Spill().ok());
    for (const auto& s : b->Draw(1000)) before.insert({IdOf(s), s.label});
  }
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() / "rehearsal/rehearsal.vrec").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto b = OpenOrDie(o);
  std::set<std::pair<uint64_t, int64_t>> after;
  for (const auto& s : b->Draw(1000)) after.insert({IdOf(s), s.label});
  EXPECT_EQ(after, before);
  EXPECT_EQ(b->seen(), 1025u);
  EXPECT_EQ(b->class_seen().at(2), 30u);
  AddOrDie(*b, 5000, 4);  // a new class after the restart still gets its place
  EXPECT_EQ(b->class_counts()[4], 1u);
  EXPECT_EQ(b->size(), 65u);

  // A smaller capacity keeps a balanced subset.
  auto small = OpenOrDie({.capacity = 20, .policy = RehearsalPolicy::kClassBalanced, .sample_bytes = 8,
                          .spill_dir = o.spill_dir});
  EXPECT_EQ(small->class_counts(), (std::map<int64_t, size_t>{{0, 5}, {1, 5}, {2, 5}, {3, 5}}));
  // restore = false starts empty.
  EXPECT_EQ(OpenOrDie({.capacity = 65, .policy = RehearsalPolicy::kClassBalanced, .spill_dir = o.spill_dir,
                       .restore = false})->size(), 0u);
}

TEST(RehearsalTest, RestoreRefusesWhatDoesNotMatch) {
  TempDir dir;
  RehearsalOptions o{.capacity = 8, .seed = 1, .sample_bytes = 8, .spill_dir = dir.path()};
  {
    auto b = OpenOrDie(o);
    for (uint64_t id = 0; id < 20; ++id) AddOrDie(*b, id, static_cast<int64_t>(id % 3));
    ASSERT_TRUE(b->Spill().ok());
  }
  auto path = dir.path() / "rehearsal.vrec";
  auto other = RehearsalBuffer::Open({.capacity = 8, .policy = RehearsalPolicy::kClassBalanced, .spill_dir = dir.path()});
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("was written with policy reservoir, the options ask for class_balanced"),
            std::string::npos);
  EXPECT_EQ(RehearsalBuffer::Open({.capacity = 8, .sample_bytes = 16, .spill_dir = dir.path()}).status().code(),
            StatusCode::kInvalidArgument);

  // A flipped byte in a sample: Corruption naming the file and the record.
  auto bytes = testing::ReadFile(path);
  auto good = bytes;
  bytes[kRecordHeaderBytes + 8 * 3 + 1] ^= std::byte{1};
  testing::WriteFile(path, bytes);
  auto bad = RehearsalBuffer::Open(o);
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_NE(bad.status().message().find(path.string() + " record 3: checksum mismatch"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("remove the file to start empty"), std::string::npos);
  // Cut short.
  testing::WriteFile(path, std::span(good).first(good.size() - 1));
  EXPECT_EQ(RehearsalBuffer::Open(o).status().code(), StatusCode::kCorruption);

  // A state that lies about the records, in an otherwise valid file.
  data_internal::RehearsalState s{0, 8, 2, 8, {{0, 1}, {1, 1}}};
  testing::MakeRecordFile(path, 3, [](uint64_t) { return 8; }, 2, data_internal::EncodeRehearsalState(s));
  auto lie = RehearsalBuffer::Open(o);
  EXPECT_EQ(lie.status().code(), StatusCode::kCorruption);
  EXPECT_NE(lie.status().message().find("label 0: more samples held than were ever seen (1)"), std::string::npos)
      << lie.status().ToString();
}

TEST(RehearsalTest, StateDecoderFaults) {
  using data_internal::DecodeRehearsalState;
  using data_internal::EncodeRehearsalState;
  data_internal::RehearsalState s{1, 10, 5, 8, {{0, 2}, {3, 3}}};
  auto good = EncodeRehearsalState(s);
  auto back = DecodeRehearsalState(good);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->class_seen, s.class_seen);
  auto fault = [&](std::vector<std::byte> b) { return DecodeRehearsalState(b).status().message(); };
  EXPECT_EQ(fault(std::vector<std::byte>(good.begin(), good.begin() + 20)),
            "rehearsal state: 20 bytes, shorter than the 48-byte fixed part");
  auto b = good;
  b[0] = std::byte{'X'};
  EXPECT_EQ(fault(b), "rehearsal state: bad magic (expected \"VRHS\")");
  b = good;
  b.pop_back();
  EXPECT_EQ(fault(b), "rehearsal state: 2 classes need 80 bytes of state, it has 79");
  s.class_seen = {{3, 2}, {0, 3}};
  EXPECT_EQ(fault(EncodeRehearsalState(s)), "rehearsal state: class 1: labels are not increasing");
  s.class_seen = {{0, 2}, {3, 2}};
  EXPECT_EQ(fault(EncodeRehearsalState(s)), "rehearsal state: the classes' seen counts add up to 4, not 5");
  s.policy = 7;
  EXPECT_EQ(fault(EncodeRehearsalState(s)), "rehearsal state: unknown policy 7");
}

TEST(RehearsalTest, ConcurrentAddsAndDraws) {
  auto b = OpenOrDie({.capacity = 50, .policy = RehearsalPolicy::kClassBalanced, .seed = 9, .sample_bytes = 8});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        if (t == 3) {
          for (const auto& s : b->Draw(8)) EXPECT_EQ(s.bytes->size(), 8u);
        } else {
          AddOrDie(*b, i, static_cast<int64_t>((i + t) % 5));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(b->seen(), 6000u);
  EXPECT_EQ(b->size(), 50u);
  for (const auto& [label, n] : b->class_counts()) EXPECT_EQ(n, 10u) << "label " << label;
}

}  // namespace
}  // namespace viper
