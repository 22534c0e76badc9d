// viper::Scheduler: the online Inference Performance Predictor. Inside a training loop it takes
// the loss of every step, measures the time per iteration, learns the checkpoint costs from the
// Publisher/Subscriber timings it is fed, refits the loss curve and re-plans periodically, and
// answers "checkpoint now?". It needs no other Viper component.
//
//   auto sched = viper::Scheduler::Create({.policy = "optimal", .warmup_end = 500, .end = 20000,
//                                          .t_infer_ns = 10'000'000, .requests = 200000});
//   for (int64_t it = 0; it <= 20000; ++it) {
//     double loss = train_step();
//     if (sched.value()->Step(it, loss).value_or(false)) publisher->Publish(...);
//   }
//
// Thread-safety: all methods are thread-safe (one internal mutex), so Report* may be called from
// a Publisher or Subscriber callback thread while the training thread calls Step(). Planning runs
// inside Observe()/Step() on the training thread (optimal: bounded by OptimalOptions::max_cells).
// The Python names are snake_case (observe, should_checkpoint, step, report_publish_stall(seconds),
// ...; python/src/schedule_bindings.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "viper/loss_fit.h"
#include "viper/schedule.h"
#include "viper/status.h"

namespace viper {

struct SchedulerOptions {
  std::string policy = "optimal";  // one of SchedulePolicies()
  int64_t warmup_end = 0;          // s: the curve is first fitted and the run planned here
  int64_t end = 0;                 // e > s: last training iteration (see duration_ns)
  int64_t epoch = 0;               // iterations per epoch (required by policy "epoch")
  int64_t t_infer_ns = 0;          // one inference request every t_infer (> 0)
  int64_t requests = 0;            // M > 0 requests in all

  // Time per iteration, as the run lives it: the mean wall-clock time per iteration between
  // Observe() calls over the last 64 intervals, leaving out the interval that holds a checkpoint
  // (its stall is t_p) and intervals over 5x the median (a pause the model has no term for).
  // t_train_ns is the estimate until 8 intervals are measured (0 = unknown until then); with
  // measure_t_train = false it is used as given (a simulation, or a known cost).
  int64_t t_train_ns = 0;
  bool measure_t_train = true;
  // Initial estimates of the checkpoint costs. t_c is replaced by the median of the last 16
  // ReportUpdateLatency() values once any are reported. t_p is what one checkpoint costs the
  // training in all: the stall, and the training slowed after it while the version is sealed,
  // hashed, written to the file tier and loaded by consumers on the same CPUs (measured in the
  // demo: a 12 ms stall, then two iterations 50-100% slower: 0.17 s in all). It is the larger of
  // the mean of the last 16 ReportPublishStall() values and that whole cost as measured (see
  // checkpoint_cost_intervals); until the run has measured the whole cost, the given t_p_ns (the
  // caller's estimate, e.g. from a warm-up) stands unless a reported stall exceeds it.
  int64_t t_p_ns = 0;
  int64_t t_c_ns = 0;
  // With measure_t_train, the whole cost of a checkpoint is measured as the excess, over the
  // clean time per iteration, of the interval that holds it and the next (this - 1) intervals;
  // the clean time per iteration (t_train) is measured on the intervals at least this many
  // intervals after a checkpoint. Needs 2 intervals at each of those distances and 8 clean ones
  // in the last 128; before that t_train is measured on every interval without a checkpoint.
  // 0: t_p is the reported stall only, t_train every interval without a checkpoint.
  int64_t checkpoint_cost_intervals = 3;

  // > 0: the run is bounded by wall-clock time, not by `end`: it ends duration_ns after the first
  // Observe(). `end` is then the initial estimate of the last iteration, and every plan moves it
  // to now + (time left) / t_train, so a run that goes faster or slower than first measured is
  // planned to its real end.
  int64_t duration_ns = 0;

  // Losses observed before the scheduler was made (e.g. a warm-up that ran before it existed),
  // strictly increasing iterations <= the first Observe(); fitted with the rest, no timing is
  // taken from them.
  std::vector<LossSample> history;

  // Refit the curve on all losses seen so far and re-plan every refit_every iterations after s
  // (0 = (e - s) / 10, at least 1). A timing estimate (t_train, t_p, t_c) that moves by more than
  // 10% from the one the plan used also triggers a re-plan at the next Observe().
  int64_t refit_every = 0;
  // ShouldCheckpoint(s) is true: the warm-up model is version x_0, live from time 0 in the CIL
  // model (it carries no stall in the model, but consumers still need it).
  bool checkpoint_at_warmup_end = true;

  // The loss fit: robust by default (RobustFitOptions(): family chosen by held-out extrapolation
  // error, monotone guard with outlier clipping, extrapolation bounded to twice the span observed).
  // When no family fits, the previous plan is kept; before any, the scheduler falls back to the
  // best observed schedule: the constant interval that would have been best on the losses seen
  // so far (smoothed), replayed forward. fit.horizon is forced to `end`.
  FitOptions fit = RobustFitOptions();
  OptimalOptions optimal;  // bounds the optimal planner's work

  // The time source of every measurement above (t_train, duration_ns): steady_clock::now when
  // empty. A simulation or a replay of a run passes its own, which must not go backwards. It is
  // called under the scheduler's lock, so it must not call the scheduler.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

// What the scheduler knows and plans. A snapshot (copy) taken under the lock.
struct SchedulerState {
  int64_t iteration = -1;            // last observed iteration
  int64_t end = 0;                   // e of the current plan (moves with duration_ns)
  int64_t t_train_ns = 0;            // current estimate (measured, or the option)
  int64_t t_p_ns = 0;                // current estimates (options, then reported and measured)
  int64_t t_c_ns = 0;
  int64_t t_p_stall_ns = 0;          // mean reported stall (0 before any)
  int64_t t_p_measured_ns = 0;       // whole cost of a checkpoint as measured (0 until measured)
  std::optional<LossFit> fit;        // the last successful fit
  std::string plan_source;           // "fit", "observed interval N" (the fallback), "" before any plan
  std::vector<int64_t> taken;        // checkpoints answered true after s
  std::vector<int64_t> planned;      // future checkpoints of the current plan
  double predicted_cil = 0.0;        // CIL of taken + planned under the current estimates
  int64_t plans = 0;                 // number of (re)plans so far
  Status last_plan_status;           // why the last plan failed (the old plan is kept), or OK
};

// What a restarted run needs to go on where a scheduler stopped (Checkpoint / Resume): everything
// it observed and measured, and where its current plan came from. The fitted curve and the plan
// are not stored: Resume re-makes them from the same losses and estimates, which gives the same
// fit, the same planned checkpoints and the same predicted CIL.
struct SchedulerCheckpoint {
  std::vector<LossSample> losses;  // every loss observed (history included), increasing iterations
  struct Interval {
    int64_t since_checkpoint = -1;  // 0: held a checkpoint, 1: the next, ...; -1: none yet
    int64_t ns_per_iteration = 0;
  };
  std::vector<Interval> intervals;  // the measured intervals kept, oldest first
  int64_t since_checkpoint = -1;
  bool checkpoint_in_interval = false;
  std::vector<int64_t> stall_ns;    // the report windows, oldest first
  std::vector<int64_t> latency_ns;
  std::vector<int64_t> taken;       // checkpoints answered true after s
  int64_t last_asked = -1;          // the last iteration ShouldCheckpoint answered
  int64_t elapsed_ns = -1;          // run time since the first Observe(); -1: none yet
  int64_t end = 0;                  // e now
  int64_t plans = 0;
  int64_t last_plan_iteration = -1;
  bool timings_moved = false;
  // The last successful plan: the iteration it was made at and the problem it solved.
  int64_t plan_iteration = -1;
  int64_t plan_end = 0, plan_t_train_ns = 0, plan_t_p_ns = 0, plan_t_c_ns = 0;
};

class Scheduler {
 public:
  // Validates the options (InvalidArgument naming the field).
  static Result<std::unique_ptr<Scheduler>> Create(SchedulerOptions options);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Records the loss observed after `iteration` and the wall-clock time since the previous call;
  // fits and plans at s, refits and re-plans every refit_every iterations.
  // REQUIRES: iterations strictly increasing, loss finite (InvalidArgument otherwise; the sample
  // is then ignored). Planning failures do not fail Observe(): see SchedulerState.
  Status Observe(int64_t iteration, double loss);

  // True if a checkpoint should be taken after `iteration`: s lies in (previous asked iteration,
  // iteration] (the warm-up model, see options), or a planned checkpoint does (so a loop that asks
  // only every few iterations still gets every checkpoint, late). A true answer for a planned
  // checkpoint counts as taken at `iteration`. Before any successful plan only s and e are
  // answered true. Asking again for an iteration already answered returns false.
  bool ShouldCheckpoint(int64_t iteration);

  // Observe() then ShouldCheckpoint().
  Result<bool> Step(int64_t iteration, double loss);

  // Timings fed by the Publisher (PublisherOptions::scheduler): the producer's stall for one
  // publish (t_p) and the time from the end of the stall until the version is live at a consumer
  // (t_c). Negative durations are ignored.
  void ReportPublishStall(std::chrono::nanoseconds stall);
  void ReportUpdateLatency(std::chrono::nanoseconds latency);

  SchedulerState state() const;

  // Everything needed to resume (see SchedulerCheckpoint), and the resume itself: into a
  // scheduler made with the same options (the caller's business: Resume checks only what it
  // can), before or instead of its own observations. The time between Checkpoint and Resume is
  // not counted in duration_ns, and the first interval after Resume is not measured (it spans the
  // restart). InvalidArgument naming what does not fit (losses not increasing or not finite,
  // negative times, a plan iteration beyond the losses...), or the error of a plan that cannot be
  // made again; the scheduler is unchanged then.
  SchedulerCheckpoint Checkpoint() const;
  Status Resume(const SchedulerCheckpoint& checkpoint);

  // Predicted CIL of a whole-run `schedule` (strictly increasing iterations in (s, e]) under the
  // curve and the estimates of the current plan: what the IPP predicts for any other schedule, e.g.
  // an epoch baseline. FailedPrecondition before the first plan.
  Result<double> Evaluate(std::span<const int64_t> schedule) const;
  const SchedulerOptions& options() const { return options_; }

 private:
  explicit Scheduler(SchedulerOptions options);
  std::chrono::steady_clock::time_point Now() const;  // options_.clock, else steady_clock
  void MeasureLocked(int64_t iteration);
  bool PlanDueLocked(int64_t iteration) const;
  void PlanLocked(int64_t iteration, bool move_end = true);
  Result<Schedule> PlanFromFitLocked(const ScheduleInputs& base);
  Result<Schedule> PlanFromObservedLocked(const ScheduleInputs& base);
  ScheduleProblem ProblemLocked() const;
  void MoveEndLocked(int64_t iteration);
  int64_t TrainEstimateLocked() const;
  int64_t MeasuredCheckpointCostLocked(int64_t t_train_ns) const;
  void RefreshCheckpointCostLocked();

  const SchedulerOptions options_;
  mutable std::mutex mu_;
  std::vector<LossSample> samples_;
  std::optional<std::chrono::steady_clock::time_point> last_time_;
  std::optional<std::chrono::steady_clock::time_point> run_start_;  // first Observe()
  int64_t end_ = 0;  // e: options_.end, or moved by the time left (duration_ns)
  struct Interval {
    int64_t since_checkpoint;  // 0: holds a checkpoint; 1: the next one; ... -1: none yet
    int64_t ns_per_iteration;
  };
  std::deque<Interval> intervals_;  // the last 128 measured intervals
  int64_t since_checkpoint_ = -1;
  std::deque<int64_t> stall_ns_window_;
  std::deque<int64_t> latency_ns_window_;
  bool checkpoint_in_interval_ = false;  // the next interval holds a checkpoint's stall
  LossCurve plan_curve_;                 // the curve the current plan used
  int64_t last_asked_ = -1;
  int64_t last_plan_iteration_ = -1;
  int64_t plan_iteration_ = -1;  // where the last successful plan was made
  bool timings_moved_ = false;
  ScheduleProblem plan_problem_;  // the problem (estimates) the current plan used
  SchedulerState state_;
};

}  // namespace viper
