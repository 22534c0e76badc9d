// The tuner's rules on synthetic windows (deterministic): climb while starved and it pays, take a
// step back that does not pay, grow the buffer when readers stand blocked, give back what stays
// unused, and never pass the caps.
#include <gtest/gtest.h>

#include "data/autotuner.h"

namespace viper::data_internal {
namespace {

// A window of one second in which the consumer waited `wait` of the time and `rate` reads
// (of 1000 bytes) completed, the readers blocked `blocked` of their time.
TunerWindow W(double wait, double rate, double blocked = 0, size_t readers = 1, size_t min_ready = 0) {
  TunerWindow w;
  w.seconds = 1;
  w.consumer_wait_seconds = wait;
  w.completed = static_cast<uint64_t>(rate);
  w.delivered = w.completed;
  w.completed_bytes = w.completed * 1000;
  w.reader_blocked_seconds = blocked * static_cast<double>(readers);
  w.min_ready = min_ready;
  return w;
}

TEST(AutoTunerTest, ClimbsWhileItPaysThenStepsBack) {
  AutoTuner t({1, 2}, {.max_readers = 64, .max_buffer_samples = 4096, .max_buffer_bytes = 1 << 30});
  std::string why;
  // Throughput scales with readers up to 8 (latency-bound storage), then stays flat.
  auto rate = [](size_t readers) { return 100.0 * static_cast<double>(std::min<size_t>(readers, 8)); };
  std::vector<size_t> path;
  for (int i = 0; i < 12; ++i) {
    TunerSetting s = t.setting();
    t.Step(W(0.5, rate(s.readers), 0, s.readers), &why);
    path.push_back(t.setting().readers);
    EXPECT_GE(t.setting().buffer_samples, t.setting().readers) << why;
  }
  // 1 -> 2 -> 4 -> 8 (each pays and doubles the step) -> 16 does not pay -> back to 8, and it stays
  // there while the failed bound is remembered.
  EXPECT_EQ(path[0], 2u);
  EXPECT_EQ(path[1], 4u);
  EXPECT_EQ(path[2], 8u);
  EXPECT_EQ(path[3], 16u);
  EXPECT_EQ(path[4], 8u);
  for (size_t i = 5; i < path.size(); ++i) EXPECT_EQ(path[i], 8u) << "window " << i;
}

TEST(AutoTunerTest, NeverPassesTheCaps) {
  // 100 samples of 1000 bytes fit in the byte cap: the buffer (and so the readers) stop there.
  AutoTuner t({1, 1}, {.max_readers = 5, .max_buffer_samples = 4096, .max_buffer_bytes = 100000});
  std::string why;
  for (int i = 0; i < 40; ++i) {
    size_t r = t.setting().readers;
    t.Step(W(0.9, 100.0 * static_cast<double>(r), i % 2 ? 0.5 : 0.0, r), &why);
    EXPECT_LE(t.setting().readers, 5u) << why;
    EXPECT_LE(t.setting().buffer_samples, 100u) << why;
  }
  EXPECT_EQ(t.setting().readers, 5u);
  AutoTuner tight({1, 1}, {.max_readers = 64, .max_buffer_samples = 4096, .max_buffer_bytes = 3000});
  for (int i = 0; i < 40; ++i) {
    size_t r = tight.setting().readers;
    tight.Step(W(0.9, 100.0 * static_cast<double>(r), 0, r), &why);
    EXPECT_LE(tight.setting().buffer_samples, 3u) << why;
    EXPECT_LE(tight.setting().readers, 3u) << "readers without a buffer slot would only block: " << why;
  }
}

TEST(AutoTunerTest, GrowsTheBufferWhenReadersStandBlocked) {
  AutoTuner t({4, 4}, {.max_readers = 64, .max_buffer_samples = 4096, .max_buffer_bytes = 1 << 30});
  std::string why;
  t.Step(W(0.1, 400, 0.4, 4), &why);
  EXPECT_EQ(t.setting().readers, 4u);
  EXPECT_EQ(t.setting().buffer_samples, 8u) << why;
  EXPECT_NE(why.find("blocked"), std::string::npos);
}

TEST(AutoTunerTest, GivesBackReadersAndSlotsWhenIdle) {
  AutoTuner t({8, 64}, {.max_readers = 64, .max_buffer_samples = 4096, .max_buffer_bytes = 1 << 30});
  std::string why;
  int changes = 0;
  for (int i = 0; i < AutoTuner::kPatience; ++i) {
    t.Step(W(0, 100, 0.9, 8, 60), &why);
    changes += !why.empty();
  }
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(t.setting().readers, 7u) << why;
  // One reader fewer made the consumer starve: back to 8, and 7 is not tried again for a while.
  t.Step(W(0.3, 100, 0, 7), &why);
  EXPECT_EQ(t.setting().readers, 8u) << why;
  for (int i = 0; i < 3 * AutoTuner::kPatience; ++i) t.Step(W(0, 100, 0.9, 8, 60), &why);
  EXPECT_EQ(t.setting().readers, 8u);
  EXPECT_LT(t.setting().buffer_samples, 64u) << "slots that always held samples are given back";
  EXPECT_GE(t.setting().buffer_samples, 8u);
}

TEST(AutoTunerTest, BetweenThresholdsNothingMoves) {
  AutoTuner t({3, 6}, {});
  std::string why;
  for (int i = 0; i < 20; ++i) {
    t.Step(W(0.01, 300, 0.2, 3, 1), &why);
    EXPECT_TRUE(why.empty()) << why;
  }
  EXPECT_EQ(t.setting(), (TunerSetting{3, 6}));
}

}  // namespace
}  // namespace viper::data_internal
