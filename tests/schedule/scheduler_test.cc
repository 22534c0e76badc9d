// viper::Scheduler, the online IPP: driven by a real training-style loop (real wall clock where
// t_train is measured), compared with the offline schedulers on the worked example.
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "schedule/test_util.h"
#include "viper/scheduler.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::WorkedCurve;
using testing::WorkedInputs;

SchedulerOptions WorkedOptions(std::string policy) {
  SchedulerOptions o;
  o.policy = std::move(policy);
  o.warmup_end = 100;
  o.end = 400;
  o.epoch = 50;
  o.t_infer_ns = 10'000'000;
  o.requests = 5000;
  o.t_train_ns = 100'000'000;
  o.t_p_ns = 500'000'000;
  o.t_c_ns = 300'000'000;
  o.refit_every = 1000;  // plan once, at s
  o.measure_t_train = false;  // the loops below run much faster than 100 ms per iteration
  o.fit = FitOptions{};       // plain least squares: the exact worked curve, unbounded
  return o;
}

// Runs the loop x = 0..e with the worked curve; returns the iterations answered true after s.
std::vector<int64_t> Drive(Scheduler& sched, int64_t ask_every = 1, bool* warmup_answered = nullptr) {
  std::vector<int64_t> yes;
  for (int64_t x = 0; x <= sched.options().end; ++x) {
    EXPECT_TRUE(sched.Observe(x, WorkedCurve().value(x)).ok());
    if (x % ask_every != 0 && x != sched.options().end) continue;
    if (!sched.ShouldCheckpoint(x)) continue;
    if (x == sched.options().warmup_end && warmup_answered) *warmup_answered = true;
    if (x > sched.options().warmup_end) yes.push_back(x);
  }
  return yes;
}

TEST(Scheduler, OnlinePlanMatchesOfflineSchedulersOnTheWorkedExample) {
  for (std::string_view policy : SchedulePolicies()) {
    SCOPED_TRACE(std::string(policy));
    Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(WorkedOptions(std::string(policy)));
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    bool warmup = false;
    const std::vector<int64_t> online = Drive(**sched, 1, &warmup);
    EXPECT_TRUE(warmup);
    ScheduleInputs in = WorkedInputs();
    Result<Schedule> offline = MakeSchedule(policy, in);
    ASSERT_TRUE(offline.ok());
    EXPECT_EQ(online, offline->iterations);
    const SchedulerState st = (*sched)->state();
    EXPECT_EQ(st.taken, online);
    EXPECT_EQ(st.plans, 1);
    ASSERT_TRUE(st.fit.has_value());
    EXPECT_EQ(st.fit->curve.family(), LossFamily::kExpOffset);
    EXPECT_NEAR(st.predicted_cil, offline->cil, 1e-6);
    EXPECT_TRUE(st.last_plan_status.ok());
  }
}

TEST(Scheduler, AskingEveryFewIterationsStillGetsEveryCheckpointLate) {
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(WorkedOptions("optimal"));
  ASSERT_TRUE(sched.ok());
  const std::vector<int64_t> yes = Drive(**sched, 7);
  const std::vector<int64_t> planned = OptimalSchedule(WorkedInputs())->iterations;
  // Each planned checkpoint is answered at the first asked iteration at or after it; 105 is the
  // first asked iteration at or after s: the warm-up model.
  std::vector<int64_t> expected = {105};
  for (int64_t x : planned) {
    const int64_t asked = x == 400 ? 400 : (x + 6) / 7 * 7;
    if (expected.empty() || expected.back() != asked) expected.push_back(asked);
  }
  EXPECT_EQ(yes, expected);
}

TEST(Scheduler, RefitsAndReplansPeriodically) {
  SchedulerOptions o = WorkedOptions("optimal");
  o.refit_every = 50;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  const std::vector<int64_t> yes = Drive(**sched);
  const SchedulerState st = (*sched)->state();
  EXPECT_EQ(st.plans, 6);  // at 100, 150, ..., 350
  // Re-planning from the taken prefix with the same (exact) curve keeps the optimum.
  EXPECT_EQ(yes, OptimalSchedule(WorkedInputs())->iterations);
}

TEST(Scheduler, ReportedTimingsTriggerAReplan) {
  SchedulerOptions o = WorkedOptions("sqrt");
  o.t_p_ns = 0;  // unknown at first: the sqrt rule then checkpoints as often as t_c allows
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  for (int64_t x = 0; x <= 100; ++x) ASSERT_TRUE(s.Observe(x, WorkedCurve().value(x)).ok());
  EXPECT_EQ(s.state().plans, 1);
  EXPECT_EQ(s.state().planned.front(), 103);  // gap ceil((t_c - t_p)/t_train) = 3
  EXPECT_EQ(s.state().planned[1], 106);
  s.ReportPublishStall(500ms);
  s.ReportUpdateLatency(300ms);
  s.ReportPublishStall(-1s);  // ignored
  ASSERT_TRUE(s.Observe(101, WorkedCurve().value(101)).ok());
  const SchedulerState st = s.state();
  EXPECT_EQ(st.plans, 2);
  EXPECT_EQ(st.t_p_ns, 500'000'000);
  EXPECT_EQ(st.t_c_ns, 300'000'000);
  ScheduleInputs in = WorkedInputs();
  in.now = 101;
  Result<Schedule> expected = SqrtSchedule(in);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(st.planned, expected->iterations);
}

TEST(Scheduler, MeasuresTrainTimeFromTheWallClock) {
  SchedulerOptions o = WorkedOptions("optimal");
  o.warmup_end = 30;
  o.end = 60;
  o.t_train_ns = 0;  // measure
  o.measure_t_train = true;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t x = 0; x <= 30; ++x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    ASSERT_TRUE((*sched)->Observe(x, WorkedCurve().value(x)).ok());
  }
  const double per_iter = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 31;
  const SchedulerState st = (*sched)->state();
  ASSERT_EQ(st.plans, 1) << st.last_plan_status.ToString();
  EXPECT_GE(st.t_train_ns, 3'000'000);
  EXPECT_LE(st.t_train_ns, static_cast<int64_t>(per_iter * 1e9 * 3));  // median, robust to slow steps
}

// A checkpoint costs the run more than its stall when the work after it (sealing, hashing, the
// consumers' loads) shares the CPUs: here each checkpoint's interval takes 20 ms more and the
// next one 10 ms more than the clean 2 ms. t_p becomes that whole cost (about 30 ms; sleeps only
// overrun, so the bounds are loose), not the 1 ms stall reported, and t_train the clean pace.
TEST(Scheduler, MeasuresTheWholeCostOfACheckpoint) {
  SchedulerOptions o = WorkedOptions("epoch");
  o.warmup_end = 10;
  o.end = 200;
  o.epoch = 5;
  o.t_train_ns = 0;
  o.t_p_ns = 0;
  o.measure_t_train = true;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  Scheduler& s = **sched;
  int64_t since = -1;
  for (int64_t x = 0; x <= 60; ++x) {
    const int64_t extra_ms = since == 0 ? 20 : since == 1 ? 10 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + extra_ms));
    Result<bool> due = s.Step(x, WorkedCurve().value(x));
    ASSERT_TRUE(due.ok());
    since = *due ? 0 : since < 0 ? -1 : since + 1;
    if (*due) s.ReportPublishStall(1ms);
  }
  const SchedulerState st = s.state();
  EXPECT_EQ(st.t_p_stall_ns, 1'000'000);
  EXPECT_GE(st.t_p_measured_ns, 15'000'000);
  EXPECT_LE(st.t_p_measured_ns, 300'000'000);
  EXPECT_EQ(st.t_p_ns, st.t_p_measured_ns);
  EXPECT_GE(st.t_train_ns, 2'000'000);
  EXPECT_LT(st.t_train_ns, st.t_p_measured_ns) << "t_train must be the clean pace";

  // Without the measurement (0 intervals), t_p is the reported stall.
  o.checkpoint_cost_intervals = 0;
  Result<std::unique_ptr<Scheduler>> plain = Scheduler::Create(o);
  ASSERT_TRUE(plain.ok());
  for (int64_t x = 0; x <= 20; ++x)
    if ((*plain)->Step(x, WorkedCurve().value(x)).value()) (*plain)->ReportPublishStall(1ms);
  EXPECT_EQ((*plain)->state().t_p_ns, 1'000'000);
  EXPECT_EQ((*plain)->state().t_p_measured_ns, 0);
}

// The caller's estimate of the whole cost (e.g. from a warm-up) stands against smaller stalls
// until the run has measured its own.
TEST(Scheduler, TheGivenCheckpointCostStandsUntilMeasured) {
  SchedulerOptions o = WorkedOptions("epoch");
  o.measure_t_train = true;
  o.t_p_ns = 200'000'000;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  (*sched)->ReportPublishStall(10ms);
  EXPECT_EQ((*sched)->state().t_p_ns, 200'000'000);
  (*sched)->ReportPublishStall(590ms);  // mean 0.3 s: a stall above the estimate replaces it
  EXPECT_EQ((*sched)->state().t_p_ns, 300'000'000);
}

TEST(Scheduler, WithoutTrainTimeThePlanWaitsAndTheEndStillCheckpoints) {
  SchedulerOptions o = WorkedOptions("optimal");
  o.warmup_end = 0;
  o.end = 5;
  o.t_train_ns = 0;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  ASSERT_TRUE(s.Observe(0, 2.0).ok());  // no interval measured yet: cannot plan
  SchedulerState st = s.state();
  EXPECT_EQ(st.plans, 0);
  EXPECT_EQ(st.last_plan_status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.last_plan_status.message().find("t_train unknown"), std::string::npos);
  EXPECT_TRUE(s.ShouldCheckpoint(0));   // the warm-up model
  EXPECT_FALSE(s.ShouldCheckpoint(0));  // asked twice: already answered
  // Fits keep failing with 2-3 samples (every family needs more), so nothing is planned; the
  // final model still goes out.
  ASSERT_TRUE(s.Observe(1, 1.9).ok());
  EXPECT_FALSE(s.ShouldCheckpoint(1));
  EXPECT_TRUE(s.Step(5, 1.5).value());
  EXPECT_EQ(s.state().taken, std::vector<int64_t>{5});
}

TEST(Scheduler, ReportsFromAnotherThreadAreSafe) {
  SchedulerOptions o = WorkedOptions("sqrt");
  o.refit_every = 20;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  std::atomic<bool> stop{false};
  std::thread reporter([&] {
    for (int i = 0; !stop.load(); ++i) {
      s.ReportPublishStall(400ms + 10ms * (i % 20));
      s.ReportUpdateLatency(300ms);
      (void)s.state();
      std::this_thread::yield();
    }
  });
  int yes = 0;
  for (int64_t x = 0; x <= 400; ++x) yes += s.Step(x, WorkedCurve().value(x)).value() ? 1 : 0;
  stop = true;
  reporter.join();
  EXPECT_GT(yes, 2);
  EXPECT_EQ(s.state().taken.back(), 400);  // sqrt always ends at e
}

// A warm-up that ran before the scheduler existed: the plan, and the predicted CIL of any other
// schedule, exist right after Create (the prediction "before the run").
TEST(Scheduler, HistoryPlansBeforeTheRunAndEvaluatesOtherSchedules) {
  SchedulerOptions o = WorkedOptions("optimal");
  for (int64_t x = 0; x <= 100; ++x) o.history.push_back({x, WorkedCurve().value(x)});
  o.checkpoint_at_warmup_end = false;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  const SchedulerState st = (*sched)->state();
  ASSERT_EQ(st.plans, 1) << st.last_plan_status.ToString();
  EXPECT_EQ(st.plan_source, "fit");
  Result<Schedule> offline = OptimalSchedule(WorkedInputs());
  EXPECT_NEAR(st.predicted_cil, offline->cil, 1e-6);
  EXPECT_EQ(st.planned, offline->iterations);
  Result<double> epoch = (*sched)->Evaluate(std::vector<int64_t>{150, 200, 250, 300, 350, 400});
  ASSERT_TRUE(epoch.ok());
  EXPECT_NEAR(*epoch, 1560.502769, 1e-6);
  EXPECT_FALSE((*sched)->Evaluate(std::vector<int64_t>{300, 200}).ok());
  EXPECT_FALSE((*sched)->Observe(100, 1.0).ok());  // the history's iterations are taken
  EXPECT_TRUE((*sched)->Observe(101, WorkedCurve().value(101)).ok());
  // Without a plan there is nothing to evaluate against.
  Result<std::unique_ptr<Scheduler>> fresh = Scheduler::Create(WorkedOptions("optimal"));
  EXPECT_EQ((*fresh)->Evaluate(std::vector<int64_t>{150}).status().code(), StatusCode::kFailedPrecondition);
  o.history = {{5, 1.0}, {4, 0.9}};
  EXPECT_NE(Scheduler::Create(o).status().message().find("history"), std::string::npos);
}

// The interval that holds a checkpoint (its stall is t_p) is not training time; the mean of the
// rest is. Generous bounds: 2 ms steps against 150 ms stalls every 4 iterations.
TEST(Scheduler, TrainTimeLeavesOutTheCheckpointStalls) {
  SchedulerOptions o = WorkedOptions("epoch");
  o.warmup_end = 4;
  o.end = 60;
  o.epoch = 4;
  o.t_train_ns = 0;
  o.measure_t_train = true;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  int stalls = 0;
  for (int64_t x = 0; x <= 40; ++x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if ((*sched)->Step(x, WorkedCurve().value(x + 100)).value()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      ++stalls;
    }
  }
  EXPECT_GE(stalls, 5);
  const int64_t t_train = (*sched)->state().t_train_ns;
  EXPECT_GE(t_train, 2'000'000);
  EXPECT_LT(t_train, 40'000'000) << "the stalls (150 ms every 4 steps) leaked into t_train";
}

// No family fits (here: only lines are allowed and they run below 0 before the end): the
// scheduler falls back to the constant interval that is best on the losses observed so far.
TEST(Scheduler, FallsBackToTheBestObservedIntervalWhenNothingFits) {
  SchedulerOptions o = WorkedOptions("optimal");
  o.fit.families = {LossFamily::kLinear};
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  const std::vector<int64_t> yes = Drive(**sched);
  const SchedulerState st = (*sched)->state();
  ASSERT_EQ(st.plans, 1) << st.last_plan_status.ToString();
  EXPECT_EQ(st.plan_source.rfind("observed interval ", 0), 0u) << st.plan_source;
  const int64_t interval = std::stoll(st.plan_source.substr(18));
  // The replay of iterations 0..100 of the worked curve with the worked costs.
  ScheduleInputs replay = WorkedInputs();
  replay.problem.warmup_end = 0;
  replay.problem.end = 100;
  replay.problem.requests = 1000;
  replay.curve = LossCurve::Custom([](double x) { return WorkedCurve().value(x); });
  EXPECT_NEAR(static_cast<double>(interval), static_cast<double>(FixedSchedule(replay)->interval), 2.0);
  ASSERT_GE(yes.size(), 2u);
  EXPECT_EQ(yes[1] - yes[0], interval);
  EXPECT_FALSE(st.fit.has_value());
}

// A run bounded by wall-clock time that goes faster than first estimated: the end moves with
// the time left, and the scheduler keeps planning past the first estimate of e. The run's clock
// is the test's: 4 ms per step whatever the machine (under a sanitizer the planning alone took
// longer than a real 2 ms step).
TEST(Scheduler, ARunBoundedByTimeIsPlannedToItsRealEnd) {
  auto clock_now = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  SchedulerOptions o = WorkedOptions("optimal");
  o.clock = [clock_now] { return *clock_now; };
  o.warmup_end = 10;
  o.end = 20;                      // at the 100 ms estimate: 10 iterations in 1 s
  o.duration_ns = 1'000'000'000;   // but the loop below makes 4 ms steps
  o.measure_t_train = true;
  o.refit_every = 5;
  o.t_p_ns = 1'000'000;
  o.t_c_ns = 1'000'000;
  o.t_infer_ns = 5'000'000;
  o.requests = 200;
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
  ASSERT_TRUE(sched.ok());
  std::vector<int64_t> yes;
  const auto t0 = *clock_now;
  for (int64_t x = 0; *clock_now - t0 < std::chrono::milliseconds(1000); ++x) {
    *clock_now += std::chrono::milliseconds(4);
    if ((*sched)->Step(x, 2.0 * std::exp(-0.01 * x) + 0.1).value() && x > 10) yes.push_back(x);
  }
  const SchedulerState st = (*sched)->state();
  // 1 s of 4 ms steps ends at iteration 250 (the first estimate was 20).
  EXPECT_NEAR(static_cast<double>(st.end), 250.0, 5.0) << "the end did not move with the measured pace";
  ASSERT_FALSE(yes.empty());
  EXPECT_GT(yes.back(), 125) << "no checkpoint in the second half of the real run";
  Result<std::unique_ptr<Scheduler>> bad = Scheduler::Create([] {
    SchedulerOptions b = WorkedOptions("optimal");
    b.duration_ns = -1;
    return b;
  }());
  EXPECT_FALSE(bad.ok());
}

TEST(Scheduler, BadOptionsAndObservationsAreRejected) {
  struct Case {
    const char* want;
    void (*mutate)(SchedulerOptions&);
  };
  const Case cases[] = {
      {"unknown policy 'best'", [](SchedulerOptions& o) { o.policy = "best"; }},
      {"end = 100 must be greater", [](SchedulerOptions& o) { o.end = 100; }},
      {"t_infer_ns = 0", [](SchedulerOptions& o) { o.t_infer_ns = 0; }},
      {"requests = -3", [](SchedulerOptions& o) { o.requests = -3; }},
      {"times must be >= 0", [](SchedulerOptions& o) { o.t_p_ns = -1; }},
      {"checkpoint_cost_intervals = -1", [](SchedulerOptions& o) { o.checkpoint_cost_intervals = -1; }},
      {"epoch = 0 must be > 0", [](SchedulerOptions& o) { o.policy = "epoch", o.epoch = 0; }},
      {"warmup_end = -1", [](SchedulerOptions& o) { o.warmup_end = -1; }},
  };
  for (const Case& c : cases) {
    SchedulerOptions o = WorkedOptions("optimal");
    c.mutate(o);
    Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
    ASSERT_FALSE(sched.ok()) << c.want;
    EXPECT_NE(sched.status().message().find(c.want), std::string::npos) << sched.status().message();
  }
  Result<std::unique_ptr<Scheduler>> sched = Scheduler::Create(WorkedOptions("optimal"));
  ASSERT_TRUE(sched.ok());
  EXPECT_TRUE((*sched)->Observe(5, 1.0).ok());
  EXPECT_NE((*sched)->Observe(5, 1.0).message().find("does not follow 5"), std::string::npos);
  EXPECT_NE((*sched)->Observe(6, std::nan("")).message().find("not finite"), std::string::npos);
  EXPECT_FALSE((*sched)->Step(4, 1.0).ok());
}

}  // namespace
}  // namespace viper
