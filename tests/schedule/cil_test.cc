// The exact CIL model: the worked example, integer-time request counting, monotonicity, bad inputs.
#include <random>

#include <gtest/gtest.h>

#include "schedule/test_util.h"
#include "viper/schedule.h"

namespace viper {
namespace {

using testing::WorkedCurve;
using testing::WorkedProblem;

std::vector<int64_t> Range(int64_t from, int64_t to, int64_t step) {
  std::vector<int64_t> out;
  for (int64_t x = from; x <= to; x += step) out.push_back(x);
  return out;
}

TEST(Cil, WorkedExampleNoCheckpoint) {
  Result<double> cil = EvaluateCil(WorkedProblem(), WorkedCurve(), {});
  ASSERT_TRUE(cil.ok()) << cil.status().ToString();
  EXPECT_NEAR(*cil, 4178.794412, 1e-6);
}

TEST(Cil, WorkedExampleEvery50) {
  const std::vector<int64_t> schedule = Range(150, 400, 50);
  Result<double> cil = EvaluateCil(WorkedProblem(), WorkedCurve(), schedule);
  ASSERT_TRUE(cil.ok()) << cil.status().ToString();
  EXPECT_NEAR(*cil, 1560.502769, 1e-6);
}

TEST(Cil, WorkedExampleEvery30) {
  Result<double> cil = EvaluateCil(WorkedProblem(), WorkedCurve(), Range(130, 400, 30));
  ASSERT_TRUE(cil.ok()) << cil.status().ToString();
  EXPECT_NEAR(*cil, 1520.025158, 1e-6);
}

TEST(Cil, RequestsBeforeIsAnIntegerCeiling) {
  ScheduleProblem p = WorkedProblem();  // t_infer = 10 ms, M = 5000
  EXPECT_EQ(RequestsBefore(p, 0), 0);
  EXPECT_EQ(RequestsBefore(p, -5), 0);
  EXPECT_EQ(RequestsBefore(p, 1), 1);  // the request at time 0 arrived before T = 1 ns
  EXPECT_EQ(RequestsBefore(p, 10'000'000), 1);
  EXPECT_EQ(RequestsBefore(p, 10'000'001), 2);
  EXPECT_EQ(RequestsBefore(p, 5'800'000'000), 580);
  EXPECT_EQ(RequestsBefore(p, int64_t{1} << 61), 5000);  // capped at M
  // A time that is not a multiple of t_infer in binary floating point: 0.3 s / 0.1 s.
  p.t_infer_ns = 100'000'000;
  EXPECT_EQ(RequestsBefore(p, 300'000'000), 3);
}

// Hand-computed small case: s = 0, e = 4, t_train = 1, t_p = 1, t_c = 1, t_infer = 2, M = 4,
// L(x) = 10 - x. Checkpoint at 2: T_1 = 2 + 1 + 1 = 4 -> N = 2. CIL = 10*2 + 8*2 = 36.
TEST(Cil, HandComputed) {
  const ScheduleProblem p{.warmup_end = 0, .end = 4, .t_train_ns = 1, .t_p_ns = 1, .t_c_ns = 1, .t_infer_ns = 2, .requests = 4};
  const LossCurve line = LossCurve::Linear(-1, 10);
  EXPECT_DOUBLE_EQ(*EvaluateCil(p, line, {}), 40.0);
  EXPECT_DOUBLE_EQ(*EvaluateCil(p, line, std::vector<int64_t>{2}), 36.0);
  // Checkpoints at 1 and 3: T_1 = 1+1+1 = 3 -> N = 2; T_2 = 3+2+1 = 6 -> N = 3.
  EXPECT_DOUBLE_EQ(*EvaluateCil(p, line, std::vector<int64_t>{1, 3}), 10 * 2 + 9 * 1 + 7 * 1);
  // A checkpoint that goes live after the last request changes nothing.
  EXPECT_DOUBLE_EQ(*EvaluateCil(p, line, std::vector<int64_t>{1, 3, 4}), 36.0);
}

// With free checkpoints (t_p = t_c = 0) an extra checkpoint on a decreasing curve never hurts.
TEST(Cil, AddingACheckpointNeverIncreasesCilWhenFree) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::uniform_int_distribution<int64_t> len(1, 200);
    ScheduleProblem p{.warmup_end = 10, .end = 10 + len(rng), .t_train_ns = 1 + static_cast<int64_t>(rng() % 1000),
                      .t_p_ns = 0, .t_c_ns = 0, .t_infer_ns = 1 + static_cast<int64_t>(rng() % 1000),
                      .requests = 1 + static_cast<int64_t>(rng() % 100000)};
    const LossCurve curve = (trial % 2 == 0) ? LossCurve::ExpOffset(1 + rng() % 5, 0.001 * (1 + rng() % 50), 0.1)
                                             : LossCurve::PowerLaw(1 + rng() % 5, 0.1 * (1 + rng() % 20), 0.05);
    std::vector<int64_t> schedule;
    double previous = *EvaluateCil(p, curve, schedule);
    // Insert random new points one at a time, keeping the schedule sorted.
    for (int add = 0; add < 20; ++add) {
      const int64_t x = p.warmup_end + 1 + static_cast<int64_t>(rng() % (p.end - p.warmup_end));
      if (std::find(schedule.begin(), schedule.end(), x) != schedule.end()) continue;
      schedule.insert(std::upper_bound(schedule.begin(), schedule.end(), x), x);
      const double now = *EvaluateCil(p, curve, schedule);
      ASSERT_LE(now, previous + 1e-9 * previous) << "trial " << trial << " adding " << x;
      previous = now;
    }
  }
}

TEST(Cil, BadProblemsAreRejectedWithTheField) {
  struct Case {
    const char* what;
    void (*mutate)(ScheduleProblem&);
  };
  const Case cases[] = {
      {"e = 100 must be greater", [](ScheduleProblem& p) { p.end = 100; }},
      {"e = 50 must be greater", [](ScheduleProblem& p) { p.end = 50; }},
      {"t_train = 0", [](ScheduleProblem& p) { p.t_train_ns = 0; }},
      {"t_train = -1", [](ScheduleProblem& p) { p.t_train_ns = -1; }},
      {"t_infer = 0", [](ScheduleProblem& p) { p.t_infer_ns = 0; }},
      {"t_p = -5", [](ScheduleProblem& p) { p.t_p_ns = -5; }},
      {"t_c = -1", [](ScheduleProblem& p) { p.t_c_ns = -1; }},
      {"requests M = 0", [](ScheduleProblem& p) { p.requests = 0; }},
      {"s = -1", [](ScheduleProblem& p) { p.warmup_end = -1; }},
      {"too large", [](ScheduleProblem& p) { p.t_train_ns = int64_t{1} << 60; }},
  };
  for (const Case& c : cases) {
    ScheduleProblem p = WorkedProblem();
    c.mutate(p);
    Result<double> cil = EvaluateCil(p, WorkedCurve(), {});
    ASSERT_FALSE(cil.ok()) << c.what;
    EXPECT_EQ(cil.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cil.status().message().find(c.what), std::string::npos) << cil.status().message();
  }
}

TEST(Cil, BadSchedulesAndCurvesAreRejected) {
  const ScheduleProblem p = WorkedProblem();
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{100}, {401}, {200, 200}, {300, 200}}) {
    Result<double> cil = EvaluateCil(p, WorkedCurve(), bad);
    ASSERT_FALSE(cil.ok());
    EXPECT_NE(cil.status().message().find("strictly increasing in (s, e]"), std::string::npos) << cil.status().message();
  }
  EXPECT_FALSE(EvaluateCil(p, LossCurve(), {}).ok());
  Result<double> nan_cil = EvaluateCil(p, LossCurve::Custom([](double) { return std::nan(""); }), {});
  ASSERT_FALSE(nan_cil.ok());
  EXPECT_NE(nan_cil.status().message().find("not finite"), std::string::npos);
}

}  // namespace
}  // namespace viper
