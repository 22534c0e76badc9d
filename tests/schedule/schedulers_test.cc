// The schedulers: the worked example, optimal against brute force and against every other
// scheduler on random scenarios, the sqrt rule against optimal, re-planning, bad inputs.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "schedule/test_util.h"
#include "viper/schedule.h"

namespace viper {
namespace {

using testing::BruteForceOptimum;
using testing::WorkedInputs;

TEST(Schedulers, WorkedExampleFixedIsInterval30) {
  Result<Schedule> fixed = FixedSchedule(WorkedInputs());
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ(fixed->interval, 30);
  EXPECT_NEAR(fixed->cil, 1520.025158, 1e-6);
  EXPECT_EQ(fixed->iterations.front(), 130);
  EXPECT_EQ(fixed->iterations.back(), 400);
  EXPECT_EQ(fixed->checkpoints(), 10);
}

TEST(Schedulers, WorkedExampleEpochAndNone) {
  Result<Schedule> epoch = EpochSchedule(WorkedInputs());
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
  EXPECT_EQ(epoch->iterations, (std::vector<int64_t>{150, 200, 250, 300, 350, 400}));
  EXPECT_NEAR(epoch->cil, 1560.502769, 1e-6);
  Result<Schedule> none = MakeSchedule("none", WorkedInputs());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->checkpoints(), 0);
  EXPECT_NEAR(none->cil, 4178.794412, 1e-6);
}

TEST(Schedulers, WorkedExampleAllPolicies) {
  double optimal = 0;
  for (std::string_view policy : SchedulePolicies()) {
    Result<Schedule> s = MakeSchedule(policy, WorkedInputs());
    ASSERT_TRUE(s.ok()) << policy << ": " << s.status().ToString();
    EXPECT_EQ(s->policy, policy);
    Result<double> again = EvaluateCil(WorkedInputs().problem, WorkedInputs().curve, s->iterations);
    ASSERT_TRUE(again.ok());
    EXPECT_DOUBLE_EQ(*again, s->cil) << policy;
    if (policy == "optimal") optimal = s->cil;
    std::printf("worked example %-8s cil %.6f checkpoints %lld\n", std::string(policy).c_str(), s->cil,
                static_cast<long long>(s->checkpoints()));
  }
  EXPECT_LE(optimal, 1520.025158);
  Result<Schedule> opt = OptimalSchedule(WorkedInputs());
  EXPECT_EQ(opt->stride, 1);
}

// Greedy takes a checkpoint exactly when the regret of waiting reaches the stall's cost.
TEST(Greedy, CheckpointsWhenTheRegretOfWaitingReachesTheStallCost) {
  const ScheduleInputs in = WorkedInputs();
  Result<Schedule> g = GreedySchedule(in);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_GT(g->checkpoints(), 3);
  const ScheduleProblem& p = in.problem;
  auto L = [&](int64_t x) { return in.curve.value(static_cast<double>(x)); };
  auto live = [&](int64_t x, int64_t k) { return (x - p.warmup_end) * p.t_train_ns + k * p.t_p_ns + p.t_c_ns; };
  auto useful = [&](int64_t k) {  // last iteration whose k-th checkpoint still serves a request
    int64_t x = p.end;
    while (x > p.warmup_end && RequestsBefore(p, live(x, k)) >= p.requests) --x;
    return x;
  };
  int64_t anchor = p.warmup_end, k = 0;
  double regret = 0;
  std::vector<int64_t> expected;
  for (int64_t x = anchor + 1; x <= useful(k + 1); ++x) {
    regret += (L(anchor) - L(x)) * static_cast<double>(RequestsBefore(p, live(x, k + 1)) - RequestsBefore(p, live(x - 1, k + 1)));
    const double cost = static_cast<double>(p.t_p_ns) / p.t_infer_ns * (L(x) - L(useful(k + 1)));
    if (regret >= cost) expected.push_back(x), anchor = x, regret = 0, ++k;
  }
  EXPECT_EQ(g->iterations, expected);
  // With free checkpoints (t_p = 0) every iteration whose loss is lower is worth one.
  ScheduleInputs free = in;
  free.problem.t_p_ns = 0;
  g = GreedySchedule(free);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->checkpoints(), 300);
}

TEST(Schedulers, SqrtFollowsTheGapRule) {
  ScheduleInputs in = WorkedInputs();
  Result<Schedule> s = SqrtSchedule(in);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->iterations.back(), 400);
  const auto& p = in.problem;
  int64_t x = 100;
  for (size_t i = 0; i + 1 < s->iterations.size(); ++i) {
    const double h = std::sqrt(2.0 * p.t_p_ns * (in.curve.value(x) - in.curve.value(400)) /
                               (p.t_train_ns * std::abs(in.curve.derivative(x))));
    x += std::max<int64_t>(1, std::llround(h));  // (t_c - t_p) < 0 here: the lower bound is 1
    EXPECT_EQ(s->iterations[i], x);
  }
  // t_c > t_p: gaps are at least ceil((t_c - t_p)/t_train) = ceil(2.5) = 3 iterations (the
  // final checkpoint at e is always taken, so the last gap may be shorter).
  in.problem.t_p_ns = 10'000'000;
  in.problem.t_c_ns = 260'000'000;
  s = SqrtSchedule(in);
  ASSERT_TRUE(s.ok());
  ASSERT_GT(s->iterations.size(), 10u);
  EXPECT_EQ(s->iterations.front(), 104);  // h(100) = 4.36 rounds to 4 >= 3
  for (size_t i = 1; i + 1 < s->iterations.size(); ++i) EXPECT_GE(s->iterations[i] - s->iterations[i - 1], 3);
  // t_c = 1 s: the bound ceil((1 - 0.01)/0.1) = 10 iterations binds everywhere but at the end.
  in.problem.t_c_ns = 1'000'000'000;
  s = SqrtSchedule(in);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->iterations.front(), 110);
  for (size_t i = 1; i + 1 < s->iterations.size(); ++i) EXPECT_GE(s->iterations[i] - s->iterations[i - 1], 10);
}

// Random scenario: a curve of one family, random costs; small enough for every-iteration grids.
struct Scenario {
  ScheduleInputs inputs;
  std::string label;
};

Scenario RandomScenario(std::mt19937_64& rng, int64_t max_len, int family) {
  std::uniform_real_distribution<double> u(0, 1);
  Scenario sc;
  ScheduleProblem& p = sc.inputs.problem;
  p.warmup_end = 2 + static_cast<int64_t>(u(rng) * 50);  // >= 2 warm-up losses for greedy on a power law
  p.end = p.warmup_end + 1 + static_cast<int64_t>(u(rng) * (max_len - 1));
  p.t_train_ns = 1'000'000 + static_cast<int64_t>(u(rng) * 1e9);
  p.t_p_ns = u(rng) < 0.2 ? 0 : static_cast<int64_t>(u(rng) * u(rng) * 5e9);  // 0: the collapsed DP
  p.t_c_ns = static_cast<int64_t>(u(rng) * 3e9);
  p.t_infer_ns = 100'000 + static_cast<int64_t>(u(rng) * 1e8);
  const double span_ns = static_cast<double>(p.end - p.warmup_end) * p.t_train_ns;
  p.requests = 1 + static_cast<int64_t>(u(rng) * 2.0 * span_ns / p.t_infer_ns);
  const double len = static_cast<double>(p.end);
  switch (family) {
    case 0: sc.inputs.curve = LossCurve::Exp(0.5 + 3 * u(rng), (0.2 + 5 * u(rng)) / len); break;
    case 1: sc.inputs.curve = LossCurve::ExpOffset(0.5 + 3 * u(rng), (0.2 + 5 * u(rng)) / len, 0.05 + u(rng)); break;
    case 2: sc.inputs.curve = LossCurve::Linear(-(0.5 + u(rng)) / len, 1.6 + u(rng)); break;
    default: sc.inputs.curve = LossCurve::PowerLaw(0.5 + 3 * u(rng), 0.1 + 1.5 * u(rng), 0.05 + 0.5 * u(rng)); break;
  }
  sc.inputs.epoch = 1 + static_cast<int64_t>(u(rng) * (p.end - p.warmup_end));
  sc.label = sc.inputs.curve.ToString() + " s=" + std::to_string(p.warmup_end) + " e=" + std::to_string(p.end) +
             " tt=" + std::to_string(p.t_train_ns) + " tp=" + std::to_string(p.t_p_ns) +
             " tc=" + std::to_string(p.t_c_ns) + " ti=" + std::to_string(p.t_infer_ns) + " M=" + std::to_string(p.requests);
  return sc;
}

TEST(Optimal, MatchesBruteForceOnSmallInstances) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 240; ++trial) {
    const Scenario sc = RandomScenario(rng, 14, trial % 4);
    Result<Schedule> opt = OptimalSchedule(sc.inputs);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    ASSERT_EQ(opt->stride, 1);
    const testing::BruteForce brute = BruteForceOptimum(sc.inputs.problem, sc.inputs.curve);
    ASSERT_NEAR(opt->cil, brute.cil, 1e-9 * std::abs(brute.cil)) << sc.label;
  }
}

// A non-monotone curve takes the Li Chao path of the DP; still exact.
TEST(Optimal, MatchesBruteForceOnNonMonotoneCurves) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 120; ++trial) {
    Scenario sc = RandomScenario(rng, 14, 1);
    const double phase = static_cast<double>(rng() % 100);
    sc.inputs.curve = LossCurve::Custom([phase](double x) { return 1.5 + std::sin(0.7 * x + phase) + 0.01 * x; });
    Result<Schedule> opt = OptimalSchedule(sc.inputs);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    const testing::BruteForce brute = BruteForceOptimum(sc.inputs.problem, sc.inputs.curve);
    ASSERT_NEAR(opt->cil, brute.cil, 1e-9 * std::abs(brute.cil)) << sc.label;
  }
}

TEST(Optimal, ReplanMatchesBruteForceOverTheSuffix) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    Scenario sc = RandomScenario(rng, 18, trial % 4);
    const ScheduleProblem& p = sc.inputs.problem;
    const int64_t now = p.warmup_end + static_cast<int64_t>(rng() % (p.end - p.warmup_end));
    std::vector<int64_t> taken;
    for (int64_t x = p.warmup_end + 1; x <= now; ++x) {
      if (rng() % 3 == 0) taken.push_back(x);
    }
    sc.inputs.now = now;
    sc.inputs.taken = taken;
    Result<Schedule> opt = OptimalSchedule(sc.inputs);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    ASSERT_TRUE(std::equal(taken.begin(), taken.end(), opt->iterations.begin()));
    const testing::BruteForce brute = BruteForceOptimum(p, sc.inputs.curve, taken, now);
    ASSERT_NEAR(opt->cil, brute.cil, 1e-9 * std::abs(brute.cil)) << sc.label << " now=" << now;
  }
}

TEST(Optimal, NeverWorseThanAnyOtherScheduler) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 120; ++trial) {
    const Scenario sc = RandomScenario(rng, 2000, trial % 4);
    Result<Schedule> opt = OptimalSchedule(sc.inputs);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    ASSERT_EQ(opt->stride, 1) << sc.label;
    for (std::string_view policy : SchedulePolicies()) {
      Result<Schedule> other = MakeSchedule(policy, sc.inputs);
      ASSERT_TRUE(other.ok()) << policy << ": " << other.status().ToString();
      ASSERT_LE(opt->cil, other->cil * (1 + 1e-12)) << policy << " beats optimal on " << sc.label;
    }
  }
}

// The sqrt rule against the optimum on smooth curves with realistic costs: 10,000 iterations of
// 400 ms after a 1,000-iteration warm-up (about 1.1 h of training), a publish stall t_p of
// 0.2 s, 2 s or 20 s (0.5 to 50 iterations), t_c = 1 s, one request every 5 ms for 1.1x or 10x
// the training time. Curves: exponential decay with and without a floor, power laws, over
// their useful range (the loss falls by 70-99% of its way to the floor during training).
//
// Where the claim does NOT hold (measured, see docs/ARCHITECTURE.md): (1) requests that stop
// before training does (the rule prices every stall against L(x) - L(e), but improvements after
// the last request are worth nothing): 0.7-4% worse at half the training time; (2) a stall so
// large that only ~5-10 checkpoints pay off (t_p = 5% of the training): the continuous
// approximation behind the rule breaks, 0.5-1% worse on exponentials; (3) t_c >> t_p: the
// design's lower bound (t_c - t_p)/t_train on the gap forbids the frequent checkpoints that the
// CIL model (where transfers overlap) rewards: 0.6-1.6% worse at t_c = 30 s, t_p = 0.02 s.
struct SqrtCase {
  const char* name;
  LossCurve curve;
};

std::vector<SqrtCase> SmoothCurves() {
  return {
      {"exp fast", LossCurve::ExpOffset(2.0, 6e-4, 0.1)},
      {"exp slow", LossCurve::ExpOffset(1.5, 2e-4, 0.2)},
      {"exp no floor", LossCurve::Exp(2.0, 3e-4)},
      {"power 0.5", LossCurve::PowerLaw(3.0, 0.5, 0.2)},
      {"power 0.3", LossCurve::PowerLaw(2.0, 0.3, 0.05)},
      {"power 1.0", LossCurve::PowerLaw(50.0, 1.0, 0.3)},
  };
}

ScheduleInputs SqrtProblem(const LossCurve& curve, double t_p_s, double t_c_s, double horizon) {
  ScheduleInputs in;
  in.problem = {.warmup_end = 1000, .end = 11000, .t_train_ns = 400'000'000,
                .t_p_ns = static_cast<int64_t>(t_p_s * 1e9), .t_c_ns = static_cast<int64_t>(t_c_s * 1e9),
                .t_infer_ns = 5'000'000, .requests = 0};
  in.problem.requests = static_cast<int64_t>(10000 * 0.4 * horizon / 0.005);
  in.curve = curve;
  return in;
}

double SqrtGapToOptimal(const ScheduleInputs& in, const char* name) {
  Result<Schedule> opt = OptimalSchedule(in);
  Result<Schedule> sq = SqrtSchedule(in);
  EXPECT_TRUE(opt.ok() && sq.ok());
  if (!opt.ok() || !sq.ok()) return 1.0;
  const double gap = (sq->cil - opt->cil) / opt->cil;
  std::printf("sqrt vs optimal %-12s t_p %5.2fs t_c %4.1fs horizon %4.1fx: sqrt %4lld ckpts, optimal %4lld "
              "(stride %lld), gap %.4f%%\n",
              name, in.problem.t_p_ns / 1e9, in.problem.t_c_ns / 1e9,
              in.problem.requests * 0.005 / (10000 * 0.4), static_cast<long long>(sq->checkpoints()),
              static_cast<long long>(opt->checkpoints()), static_cast<long long>(opt->stride), 100 * gap);
  EXPECT_GE(gap, -1e-12) << name;
  return gap;
}

TEST(Sqrt, WithinHalfAPercentOfOptimalOnSmoothCurves) {
  for (const SqrtCase& c : SmoothCurves()) {
    for (double t_p : {0.2, 2.0, 20.0}) {
      for (double horizon : {1.1, 10.0}) {
        EXPECT_LE(SqrtGapToOptimal(SqrtProblem(c.curve, t_p, 1.0, horizon), c.name), 0.005)
            << c.name << " t_p " << t_p << " horizon " << horizon;
      }
    }
  }
}

// Not an assertion on the rule: prints the regimes above where it falls behind.
TEST(Sqrt, PrintsTheRegimesWhereItFallsBehind) {
  const LossCurve exp_curve = LossCurve::Exp(2.0, 3e-4);
  const double early_stop = SqrtGapToOptimal(SqrtProblem(exp_curve, 20.0, 1.0, 0.5), "requests end");
  const double huge_stall = SqrtGapToOptimal(SqrtProblem(exp_curve, 200.0, 1.0, 1.0), "huge stall");
  const double slow_live = SqrtGapToOptimal(SqrtProblem(exp_curve, 0.02, 30.0, 1.1), "t_c >> t_p");
  EXPECT_GT(early_stop + huge_stall + slow_live, 0.0);
}

// Greedy against the epoch baseline and the optimum on the paper-like curves above (10,000
// iterations of 400 ms, t_p 0.2-20 s, requests for 1.1x or 10x the training time), with epochs
// of 1/5 to 1/100 of the run: greedy is never worse than any epoch schedule and stays within 1%
// of optimal (measured: within 0.01%, where the best of those epochs is 0.003-0.7% above it).
TEST(Greedy, NeverLosesToEpochOnPaperLikeCurves) {
  for (const SqrtCase& c : SmoothCurves()) {
    for (double t_p : {0.2, 2.0, 20.0}) {
      for (double horizon : {1.1, 10.0}) {
        ScheduleInputs in = SqrtProblem(c.curve, t_p, 1.0, horizon);
        Result<Schedule> greedy = GreedySchedule(in), opt = OptimalSchedule(in);
        ASSERT_TRUE(greedy.ok() && opt.ok());
        double best_epoch = std::numeric_limits<double>::infinity();
        for (int64_t epochs : {5, 10, 20, 50, 100}) {
          in.epoch = (in.problem.end - in.problem.warmup_end) / epochs;
          Result<Schedule> epoch = EpochSchedule(in);
          ASSERT_TRUE(epoch.ok());
          best_epoch = std::min(best_epoch, epoch->cil);
        }
        const double gap = (greedy->cil - opt->cil) / opt->cil;
        std::printf("greedy %-12s t_p %5.1fs horizon %4.1fx: greedy %4lld ckpts, optimal %4lld, gap %.4f%%, "
                    "best epoch %+.3f%%\n",
                    c.name, t_p, horizon, static_cast<long long>(greedy->checkpoints()),
                    static_cast<long long>(opt->checkpoints()), 100 * gap, 100 * (best_epoch - opt->cil) / opt->cil);
        EXPECT_LE(greedy->cil, best_epoch) << c.name << " t_p " << t_p << " horizon " << horizon;
        EXPECT_LE(gap, 0.01) << c.name << " t_p " << t_p << " horizon " << horizon;
      }
    }
  }
}

// Where greedy falls behind (docs/ARCHITECTURE.md "greedy"): printed, with the gap to optimal
// and to the best epoch schedule; the only assertion is that the optimum stays the minimum.
double GreedyGap(const ScheduleInputs& base, const char* name) {
  ScheduleInputs in = base;
  Result<Schedule> greedy = GreedySchedule(in), opt = OptimalSchedule(in);
  EXPECT_TRUE(greedy.ok() && opt.ok());
  if (!greedy.ok() || !opt.ok()) return 1.0;
  double best_epoch = std::numeric_limits<double>::infinity();
  int64_t best_epochs = 0;
  for (int64_t epochs : {1, 2, 3, 5, 10, 20, 50, 100}) {
    in.epoch = std::max<int64_t>(1, (in.problem.end - in.problem.warmup_end) / epochs);
    Result<Schedule> epoch = EpochSchedule(in);
    if (epoch.ok() && epoch->cil < best_epoch) best_epoch = epoch->cil, best_epochs = epochs;
  }
  const double gap = (greedy->cil - opt->cil) / opt->cil;
  std::printf("greedy regime %-22s greedy %4lld ckpts, optimal %4lld, gap %+.3f%%, best epoch (%lld) %+.3f%%\n", name,
              static_cast<long long>(greedy->checkpoints()), static_cast<long long>(opt->checkpoints()), 100 * gap,
              static_cast<long long>(best_epochs), 100 * (best_epoch - opt->cil) / opt->cil);
  EXPECT_GE(gap, -1e-9) << name;
  return gap;
}

TEST(Greedy, PrintsTheRegimesWhereItFallsBehind) {
  const LossCurve exp_curve = LossCurve::Exp(2.0, 3e-4);
  GreedyGap(SqrtProblem(exp_curve, 20.0, 1.0, 0.5), "requests end at half");
  GreedyGap(SqrtProblem(exp_curve, 200.0, 1.0, 1.0), "huge stall (200 s)");
  GreedyGap(SqrtProblem(exp_curve, 800.0, 1.0, 1.0), "huger stall (800 s)");
  GreedyGap(SqrtProblem(exp_curve, 0.02, 30.0, 1.1), "t_c >> t_p");
  // A slow start (sigmoid): the regret builds up late, and so do the checkpoints.
  const LossCurve sigmoid = LossCurve::Custom([](double x) { return 0.2 + 2.0 / (1 + std::exp((x - 4000) / 600)); });
  GreedyGap(SqrtProblem(sigmoid, 2.0, 1.0, 1.1), "sigmoid, t_p 2 s");
  GreedyGap(SqrtProblem(sigmoid, 20.0, 1.0, 1.1), "sigmoid, t_p 20 s");
  // Few requests: one every 40 s (a checkpoint's value is lumpy).
  ScheduleInputs sparse = SqrtProblem(exp_curve, 2.0, 1.0, 1.1);
  sparse.problem.t_infer_ns = 40'000'000'000;
  sparse.problem.requests = 110;
  GreedyGap(sparse, "one request per 40 s");
}

// The held-out scenario: a power law whose warm-up losses are noisy minibatch values;
// every policy plans on the fit of the warm-up and is scored on the true curve.
TEST(Greedy, HeldOutNoisyPowerLawBeatsEpoch) {
  const LossCurve truth = LossCurve::PowerLaw(3.0, 0.4, 0.2);
  for (double noise : {0.0, 0.05, 0.2}) {
    std::mt19937_64 rng(1);
    std::normal_distribution<double> gauss(0.0, 1.0);
    std::vector<LossSample> log;
    for (int64_t x = 0; x <= 500; ++x) log.push_back({x, truth.value(std::max<double>(x, 1)) * (1 + noise * gauss(rng))});
    const ScheduleProblem p = {.warmup_end = 500, .end = 10000, .t_train_ns = 100'000'000, .t_p_ns = 2'000'000'000,
                               .t_c_ns = 1'000'000'000, .t_infer_ns = 50'000'000, .requests = 19000};
    Result<FittedInputs> f = FitScheduleInputs(log, p, 950);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto on_truth = [&](std::string_view policy) {
      Result<Schedule> s = MakeSchedule(policy, f->inputs);
      EXPECT_TRUE(s.ok()) << policy;
      return s.ok() ? EvaluateCil(p, truth, s->iterations).value_or(NAN) : NAN;
    };
    const double greedy = on_truth("greedy"), epoch = on_truth("epoch"), optimal = on_truth("optimal");
    std::printf("held-out power law, warm-up noise %.0f%%: greedy %.1f epoch %.1f optimal %.1f (true curve)\n",
                100 * noise, greedy, epoch, optimal);
    EXPECT_LT(greedy, epoch) << "noise " << noise;
    EXPECT_LE(greedy, optimal * 1.01) << "noise " << noise;
  }
}

TEST(Optimal, StrideRuleBoundsTheWork) {
  ScheduleInputs in;
  in.problem = {.warmup_end = 0, .end = 100'000, .t_train_ns = 100'000'000, .t_p_ns = 50'000'000,
                .t_c_ns = 100'000'000, .t_infer_ns = 1'000'000, .requests = 20'000'000};
  in.curve = LossCurve::PowerLaw(3.0, 0.5, 0.2);
  in.problem.warmup_end = 100;
  in.optimal.max_cells = 2'000'000;
  Result<Schedule> opt = OptimalSchedule(in);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  EXPECT_GT(opt->stride, 1);
  EXPECT_LE(opt->dp_cells, in.optimal.max_cells);
  for (int64_t x : opt->iterations) EXPECT_TRUE(x == in.problem.end || (x - 100) % opt->stride == 0) << x;
  // One stride finer would not fit: the rule picks the smallest stride that does.
  ScheduleInputs finer = in;
  finer.optimal.max_cells = opt->dp_cells - 1;
  Result<Schedule> coarser = OptimalSchedule(finer);
  ASSERT_TRUE(coarser.ok());
  EXPECT_GT(coarser->stride, opt->stride);
  // With t_p = 0 the layers collapse and every iteration is a candidate.
  in.problem.t_p_ns = 0;
  opt = OptimalSchedule(in);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(opt->stride, 1);
}

// A billion iterations but requests that end after the first thousand: the DP only touches the
// candidates where a checkpoint can still matter (memory and time O(cells), not O(e - s)).
TEST(Optimal, LongRunShortRequestStreamStaysSmall) {
  ScheduleInputs in;
  in.problem = {.warmup_end = 10, .end = 1'000'000'010, .t_train_ns = 1'000'000, .t_p_ns = 5'000'000,
                .t_c_ns = 2'000'000, .t_infer_ns = 1'000'000, .requests = 1000};
  in.curve = LossCurve::ExpOffset(2.0, 0.01, 0.1);
  Result<Schedule> opt = OptimalSchedule(in);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  EXPECT_EQ(opt->stride, 1);
  EXPECT_LT(opt->dp_cells, 1'000'000);
  ASSERT_FALSE(opt->iterations.empty());
  EXPECT_LT(opt->iterations.back(), 1010);
}

// Not a timed assertion: prints the time of the optimal scheduler at e - s = 100,000 with the
// default budget (the benchmark viper_schedule_bench reports it against a baseline).
TEST(Optimal, PrintsTimeAtOneHundredThousandIterations) {
  ScheduleInputs in;
  in.problem = {.warmup_end = 1000, .end = 101'000, .t_train_ns = 100'000'000, .t_p_ns = 1'000'000'000,
                .t_c_ns = 500'000'000, .t_infer_ns = 1'000'000, .requests = 11'000'000};
  in.curve = LossCurve::ExpOffset(2.0, 3e-5, 0.1);
  const auto t0 = std::chrono::steady_clock::now();
  Result<Schedule> opt = OptimalSchedule(in);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  std::printf("optimal e-s=100000: %.3f s, stride %lld, %lld cells, %lld checkpoints, cil %.4f\n", secs,
              static_cast<long long>(opt->stride), static_cast<long long>(opt->dp_cells),
              static_cast<long long>(opt->checkpoints()), opt->cil);
}

TEST(Schedulers, FitScheduleInputsUsesTheWarmupRowsOnly) {
  std::vector<LossSample> log;
  for (int64_t x = 0; x <= 400; ++x) {
    log.push_back({x, x <= 100 ? testing::WorkedCurve().value(x) : 9.0 - 0.001 * x});  // later rows ignored
  }
  Result<FittedInputs> f = FitScheduleInputs(log, testing::WorkedProblem(), 50);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->fit.curve.family(), LossFamily::kExpOffset);
  EXPECT_EQ(f->samples, 101u);
  EXPECT_EQ(f->inputs.epoch, 50);
  Result<Schedule> fixed = MakeSchedule("fixed", f->inputs);
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->interval, 30);
  EXPECT_NEAR(fixed->cil, 1520.025158, 1e-6);
  const std::vector<LossSample> late = {{200, 1.0}, {201, 0.9}};
  Result<FittedInputs> none = FitScheduleInputs(late, testing::WorkedProblem());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no loss sample at or before the warm-up end 100"), std::string::npos);
  ScheduleProblem bad = testing::WorkedProblem();
  bad.t_infer_ns = 0;
  EXPECT_NE(FitScheduleInputs(log, bad).status().message().find("t_infer = 0"), std::string::npos);
}

TEST(Schedulers, BadInputsGiveClearErrors) {
  ScheduleInputs in = WorkedInputs();
  in.problem.end = in.problem.warmup_end;
  for (std::string_view policy : SchedulePolicies()) {
    Result<Schedule> s = MakeSchedule(policy, in);
    ASSERT_FALSE(s.ok()) << policy;
    EXPECT_NE(s.status().message().find("must be greater than the warm-up end"), std::string::npos) << s.status().message();
  }
  in = WorkedInputs();
  in.problem.t_train_ns = 0;
  EXPECT_NE(MakeSchedule("optimal", in).status().message().find("t_train = 0 ns must be > 0"), std::string::npos);
  in = WorkedInputs();
  in.epoch = 0;
  EXPECT_NE(EpochSchedule(in).status().message().find("epoch = 0 must be > 0"), std::string::npos);
  in = WorkedInputs();
  in.curve = LossCurve();
  EXPECT_NE(OptimalSchedule(in).status().message().find("no loss curve"), std::string::npos);
  in = WorkedInputs();
  EXPECT_NE(MakeSchedule("bogus", in).status().message().find("unknown policy 'bogus'"), std::string::npos);
  in.now = 50;
  EXPECT_NE(OptimalSchedule(in).status().message().find("outside [s, e]"), std::string::npos);
  in.now = 200;
  in.taken = {150, 140};
  EXPECT_NE(SqrtSchedule(in).status().message().find("strictly increasing"), std::string::npos);
  in = WorkedInputs();
  in.optimal.max_cells = 0;
  EXPECT_NE(OptimalSchedule(in).status().message().find("max_cells = 0 must be in"), std::string::npos);
  // A power law has no value at iteration 0: a warm-up ending at 0 cannot be scored.
  in = WorkedInputs();
  in.problem.warmup_end = 0;
  in.curve = LossCurve::PowerLaw(1, 0.5, 0.1);
  Result<Schedule> s = OptimalSchedule(in);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not finite"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace viper
