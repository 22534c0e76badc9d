// viper::Scheduler: the online IPP (see include/viper/scheduler.h).
#include "viper/scheduler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "viper/log.h"

namespace viper {

namespace {

constexpr size_t kTrainWindow = 64;        // intervals t_train is measured on
constexpr size_t kIntervalWindow = 128;    // intervals kept, of every kind
constexpr size_t kMinTrainSamples = 8;
constexpr size_t kMinCostSamples = 2;      // intervals at each distance after a checkpoint
constexpr size_t kReportWindow = 16;

int64_t Median(const std::deque<int64_t>& window) {
  std::vector<int64_t> v(window.begin(), window.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Mean of the values up to 5x the median: what the run pays on average, without a pause that
// belongs to no term of the model (a checkpoint stall the scheduler was not told about).
int64_t MeanWithoutPauses(const std::deque<int64_t>& window) {
  const int64_t limit = 5 * Median(window);
  long double sum = 0;
  int64_t n = 0;
  for (int64_t v : window) {
    if (v <= limit) sum += v, ++n;
  }
  return static_cast<int64_t>(std::llround(sum / n));
}

int64_t Mean(const std::deque<int64_t>& window) {
  long double sum = 0;
  for (int64_t v : window) sum += v;
  return static_cast<int64_t>(std::llround(sum / static_cast<long double>(window.size())));
}

void Push(std::deque<int64_t>& window, int64_t value, size_t limit) {
  window.push_back(value);
  if (window.size() > limit) window.pop_front();
}

// The losses seen so far as a curve: smoothed (noise dominates single minibatches), linearly
// interpolated, flat outside. What the fallback replays.
LossCurve ObservedCurve(std::span<const LossSample> samples) {
  const int window = samples.size() < 5 ? 1 : (std::clamp(static_cast<int>(samples.size() / 25), 5, 101) | 1);
  auto xs = std::make_shared<std::vector<double>>();
  auto ys = std::make_shared<std::vector<double>>(SmoothLosses(samples, window));
  for (const LossSample& s : samples) xs->push_back(static_cast<double>(s.iteration));
  return LossCurve::Custom(
      [xs, ys](double x) {
        if (x <= xs->front()) return ys->front();
        if (x >= xs->back()) return ys->back();
        const size_t i = static_cast<size_t>(std::upper_bound(xs->begin(), xs->end(), x) - xs->begin());
        const double t = (x - (*xs)[i - 1]) / ((*xs)[i] - (*xs)[i - 1]);
        return (*ys)[i - 1] + t * ((*ys)[i] - (*ys)[i - 1]);
      },
      {}, fmt::format("observed losses (smoothed over {} samples)", window));
}

// A new estimate is worth a re-plan when it moved by more than 10% (and more than 1 us).
bool Moved(int64_t used, int64_t now) {
  return std::llabs(now - used) > std::max<int64_t>(used / 10, 1000);
}

Status ValidateOptions(const SchedulerOptions& o) {
  const auto policies = SchedulePolicies();
  if (std::find(policies.begin(), policies.end(), o.policy) == policies.end()) {
    return Status::InvalidArgument(
        fmt::format("scheduler: unknown policy '{}' (known: {})", o.policy, fmt::join(policies, ", ")));
  }
  if (o.warmup_end < 0) return Status::InvalidArgument(fmt::format("scheduler: warmup_end = {} must be >= 0", o.warmup_end));
  if (o.end <= o.warmup_end) {
    return Status::InvalidArgument(
        fmt::format("scheduler: end = {} must be greater than warmup_end = {}", o.end, o.warmup_end));
  }
  if (o.t_infer_ns <= 0) return Status::InvalidArgument(fmt::format("scheduler: t_infer_ns = {} must be > 0", o.t_infer_ns));
  if (o.requests <= 0) return Status::InvalidArgument(fmt::format("scheduler: requests = {} must be > 0", o.requests));
  if (o.duration_ns < 0) return Status::InvalidArgument(fmt::format("scheduler: duration_ns = {} must be >= 0", o.duration_ns));
  if (o.t_train_ns < 0 || o.t_p_ns < 0 || o.t_c_ns < 0) {
    return Status::InvalidArgument(fmt::format("scheduler: times must be >= 0 (t_train_ns = {}, t_p_ns = {}, t_c_ns = {})",
                                               o.t_train_ns, o.t_p_ns, o.t_c_ns));
  }
  if (o.checkpoint_cost_intervals < 0 || o.checkpoint_cost_intervals > 32)
    return Status::InvalidArgument(fmt::format("scheduler: checkpoint_cost_intervals = {} must be in [0, 32]",
                                               o.checkpoint_cost_intervals));
  if (o.refit_every < 0) return Status::InvalidArgument(fmt::format("scheduler: refit_every = {} must be >= 0", o.refit_every));
  if (o.epoch < 0 || (o.policy == "epoch" && o.epoch == 0)) {
    return Status::InvalidArgument(fmt::format("scheduler: epoch = {} must be > 0 for policy 'epoch'", o.epoch));
  }
  if (!o.history.empty()) {
    Status history = ValidateLossSamples(o.history);
    if (!history.ok()) return history.WithContext("scheduler: history");
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::Create(SchedulerOptions options) {
  VIPER_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.refit_every == 0) options.refit_every = std::max<int64_t>(1, (options.end - options.warmup_end) / 10);
  options.fit.horizon = options.end;
  std::unique_ptr<Scheduler> scheduler(new Scheduler(std::move(options)));
  // A history that covers the warm-up: the plan (and its predicted CIL) exists before the run.
  const int64_t seen = scheduler->state_.iteration;
  if (seen >= scheduler->options_.warmup_end && seen < scheduler->end_) {
    std::lock_guard<std::mutex> lock(scheduler->mu_);
    scheduler->PlanLocked(seen);
  }
  return scheduler;
}

Scheduler::Scheduler(SchedulerOptions options)
    : options_(std::move(options)), samples_(options_.history), end_(options_.end) {
  state_.end = end_;
  state_.t_p_ns = options_.t_p_ns;
  state_.t_c_ns = options_.t_c_ns;
  state_.t_train_ns = options_.t_train_ns;
  if (!samples_.empty()) state_.iteration = samples_.back().iteration;
}

Status Scheduler::Observe(int64_t iteration, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!std::isfinite(loss)) {
    return Status::InvalidArgument(fmt::format("scheduler: loss {} at iteration {} is not finite", loss, iteration));
  }
  if (iteration < 0 || (!samples_.empty() && iteration <= samples_.back().iteration)) {
    return Status::InvalidArgument(fmt::format("scheduler: iteration {} does not follow {} (must increase)", iteration,
                                               samples_.empty() ? -1 : samples_.back().iteration));
  }
  if (!run_start_) run_start_ = Now();
  MeasureLocked(iteration);
  samples_.push_back({iteration, loss});
  state_.iteration = iteration;
  if (PlanDueLocked(iteration)) PlanLocked(iteration);
  return Status::OK();
}

std::chrono::steady_clock::time_point Scheduler::Now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

void Scheduler::MeasureLocked(int64_t iteration) {
  const auto now = Now();
  if (last_time_ && !samples_.empty()) {
    const int64_t dt = std::chrono::duration_cast<std::chrono::nanoseconds>(now - *last_time_).count();
    since_checkpoint_ = checkpoint_in_interval_ ? 0 : since_checkpoint_ < 0 ? -1 : since_checkpoint_ + 1;
    intervals_.push_back({since_checkpoint_, std::max<int64_t>(1, dt / (iteration - samples_.back().iteration))});
    if (intervals_.size() > kIntervalWindow) intervals_.pop_front();
  }
  checkpoint_in_interval_ = false;
  last_time_ = now;
  state_.t_train_ns = TrainEstimateLocked();
  RefreshCheckpointCostLocked();
}

// The clean time per iteration: the last kTrainWindow intervals far enough from a checkpoint to
// be free of its cost; until there are enough of them, every interval without a checkpoint.
int64_t Scheduler::TrainEstimateLocked() const {
  const bool measured = options_.measure_t_train || options_.t_train_ns <= 0;
  if (!measured) return options_.t_train_ns;
  auto collect = [&](int64_t min_distance) {
    std::deque<int64_t> window;
    for (auto it = intervals_.rbegin(); it != intervals_.rend() && window.size() < kTrainWindow; ++it)
      if (it->since_checkpoint < 0 || it->since_checkpoint >= min_distance) window.push_front(it->ns_per_iteration);
    return window;
  };
  std::deque<int64_t> clean = collect(std::max<int64_t>(1, options_.checkpoint_cost_intervals));
  if (clean.size() >= kMinTrainSamples) return MeanWithoutPauses(clean);
  std::deque<int64_t> without_checkpoint = collect(1);
  if (without_checkpoint.size() >= kMinTrainSamples || (options_.t_train_ns <= 0 && !without_checkpoint.empty()))
    return MeanWithoutPauses(without_checkpoint);
  return options_.t_train_ns;
}

// Sum over the first checkpoint_cost_intervals intervals after a checkpoint (the one holding it
// first) of their mean excess over the clean time: what one checkpoint costs the training in
// all. 0 while there are too few intervals at any of those distances.
int64_t Scheduler::MeasuredCheckpointCostLocked(int64_t t_train_ns) const {
  const int64_t n = options_.checkpoint_cost_intervals;
  if (!options_.measure_t_train || n <= 0 || t_train_ns <= 0) return 0;
  int64_t clean = 0;
  for (const Interval& i : intervals_) clean += i.since_checkpoint < 0 || i.since_checkpoint >= n;
  if (clean < static_cast<int64_t>(kMinTrainSamples)) return 0;
  long double excess = 0;
  for (int64_t d = 0; d < n; ++d) {
    long double sum = 0;
    size_t count = 0;
    for (const Interval& i : intervals_)
      if (i.since_checkpoint == d) sum += i.ns_per_iteration, ++count;
    if (count < kMinCostSamples) return 0;
    excess += sum / count - t_train_ns;
  }
  return std::max<int64_t>(1, std::llround(excess));
}

// t_p: the larger of the mean reported stall and the measured whole cost; before the latter is
// measured, the caller's estimate (options) unless a reported stall is larger.
void Scheduler::RefreshCheckpointCostLocked() {
  state_.t_p_measured_ns = MeasuredCheckpointCostLocked(state_.t_train_ns);
  const bool estimate_stands = stall_ns_window_.empty() || options_.measure_t_train;
  const int64_t whole = state_.t_p_measured_ns > 0 ? state_.t_p_measured_ns : estimate_stands ? options_.t_p_ns : 0;
  const int64_t estimate = std::max(state_.t_p_stall_ns, whole);
  if (state_.plans > 0 && Moved(plan_problem_.t_p_ns, estimate)) timings_moved_ = true;
  state_.t_p_ns = estimate;
}

bool Scheduler::PlanDueLocked(int64_t iteration) const {
  if (iteration < options_.warmup_end) return false;
  if (iteration >= end_) return options_.duration_ns > 0;  // time is left: the end moves on
  // Until a plan succeeds (e.g. t_train still unmeasured) every observation retries.
  return state_.plans == 0 || iteration - last_plan_iteration_ >= options_.refit_every || timings_moved_ ||
         Moved(plan_problem_.t_train_ns, state_.t_train_ns);
}

void Scheduler::MoveEndLocked(int64_t iteration) {
  if (options_.duration_ns <= 0 || !run_start_ || state_.t_train_ns <= 0) return;
  const int64_t elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Now() - *run_start_).count();
  const int64_t left = std::max<int64_t>(0, options_.duration_ns - elapsed);
  end_ = std::max(iteration + 1, iteration + left / state_.t_train_ns);
  state_.end = end_;
}

ScheduleProblem Scheduler::ProblemLocked() const {
  return {options_.warmup_end, end_, state_.t_train_ns, state_.t_p_ns, state_.t_c_ns, options_.t_infer_ns,
          options_.requests};
}

Result<Schedule> Scheduler::PlanFromFitLocked(const ScheduleInputs& base) {
  FitOptions fit_options = options_.fit;
  fit_options.horizon = end_;
  Result<LossFit> fit = FitLossCurve(samples_, fit_options);
  if (!fit.ok()) return fit.status();
  ScheduleInputs in = base;
  in.curve = fit->curve;
  VIPER_ASSIGN_OR_RETURN(Schedule plan, MakeSchedule(options_.policy, in));
  state_.fit = std::move(fit).value();
  plan_curve_ = in.curve;
  state_.plan_source = "fit";
  return plan;
}

Result<Schedule> Scheduler::PlanFromObservedLocked(const ScheduleInputs& base) {
  // Replay the observed window as if it were the future: its best constant interval.
  const int64_t first = samples_.front().iteration, last = samples_.back().iteration;
  if (samples_.size() < 3 || last - first < 2) {
    return Status::FailedPrecondition("too few losses observed to replay");
  }
  ScheduleInputs replay = base;
  replay.curve = ObservedCurve(samples_);
  replay.now = -1;
  replay.taken.clear();
  replay.problem.warmup_end = first;
  replay.problem.end = last;
  const int64_t span_ns = (last - first) * base.problem.t_train_ns;
  replay.problem.requests = std::max<int64_t>(1, (span_ns + base.problem.t_infer_ns - 1) / base.problem.t_infer_ns);
  VIPER_ASSIGN_OR_RETURN(Schedule best, FixedSchedule(replay));
  ScheduleInputs in = base;
  in.curve = replay.curve;
  in.epoch = best.interval;
  VIPER_ASSIGN_OR_RETURN(Schedule plan, EpochSchedule(in));
  plan_curve_ = in.curve;
  state_.plan_source = fmt::format("observed interval {}", best.interval);
  return plan;
}

void Scheduler::PlanLocked(int64_t iteration, bool move_end) {
  last_plan_iteration_ = iteration;
  timings_moved_ = false;
  if (move_end) MoveEndLocked(iteration);
  ScheduleInputs base;
  base.problem = ProblemLocked();
  base.epoch = options_.epoch;
  base.optimal = options_.optimal;
  base.now = iteration;
  base.taken = state_.taken;
  Result<Schedule> plan = Status::FailedPrecondition(
      "scheduler: t_train unknown (options.t_train_ns = 0 and fewer than two Observe() calls)");
  if (base.problem.t_train_ns > 0) {
    plan = PlanFromFitLocked(base);
    if (!plan.ok() && state_.plans == 0) {
      Result<Schedule> fallback = PlanFromObservedLocked(base);
      plan = fallback.ok() ? std::move(fallback) : plan.status().WithContext(
          fmt::format("no fallback either ({})", fallback.status().message()));
    }
  }
  if (!plan.ok()) {
    // Keep the previous plan; the next refit retries.
    if (plan.status().message() != state_.last_plan_status.message()) {
      log(LogLevel::kWarn, "schedule", "plan at iteration {} failed (keeping the previous plan): {}", iteration,
          plan.status().message());
    }
    state_.last_plan_status = plan.status().WithContext(fmt::format("scheduler: plan at iteration {}", iteration));
    return;
  }
  plan_problem_ = base.problem;
  plan_iteration_ = iteration;
  state_.planned.assign(plan->iterations.begin() + static_cast<std::ptrdiff_t>(base.taken.size()), plan->iterations.end());
  state_.predicted_cil = plan->cil;
  state_.last_plan_status = Status::OK();
  ++state_.plans;
}

bool Scheduler::ShouldCheckpoint(int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t from = last_asked_;
  if (iteration <= from) return false;  // this range was already answered
  last_asked_ = iteration;
  const bool warmup_model = options_.checkpoint_at_warmup_end && from < options_.warmup_end &&
                            options_.warmup_end <= iteration;
  bool planned_due = false;
  auto& planned = state_.planned;
  while (!planned.empty() && planned.front() <= iteration) {
    planned_due = planned_due || planned.front() > from;
    planned.erase(planned.begin());
  }
  // Before any successful plan, at least the final model goes out.
  if (state_.plans == 0 && from < end_ && end_ <= iteration) planned_due = true;
  if (planned_due && iteration > options_.warmup_end && (options_.duration_ns > 0 || iteration <= end_) &&
      (state_.taken.empty() || iteration > state_.taken.back())) {
    state_.taken.push_back(iteration);
  }
  if (warmup_model || planned_due) checkpoint_in_interval_ = true;
  return warmup_model || planned_due;
}

Result<bool> Scheduler::Step(int64_t iteration, double loss) {
  VIPER_RETURN_IF_ERROR(Observe(iteration, loss));
  return ShouldCheckpoint(iteration);
}

void Scheduler::ReportPublishStall(std::chrono::nanoseconds stall) {
  if (stall.count() < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Push(stall_ns_window_, stall.count(), kReportWindow);
  state_.t_p_stall_ns = Mean(stall_ns_window_);
  RefreshCheckpointCostLocked();
}

void Scheduler::ReportUpdateLatency(std::chrono::nanoseconds latency) {
  if (latency.count() < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Push(latency_ns_window_, latency.count(), kReportWindow);
  const int64_t estimate = Median(latency_ns_window_);
  if (state_.plans > 0 && Moved(plan_problem_.t_c_ns, estimate)) timings_moved_ = true;
  state_.t_c_ns = estimate;
}

SchedulerState Scheduler::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

SchedulerCheckpoint Scheduler::Checkpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerCheckpoint c;
  c.losses = samples_;
  for (const Interval& i : intervals_) c.intervals.push_back({i.since_checkpoint, i.ns_per_iteration});
  c.since_checkpoint = since_checkpoint_;
  c.checkpoint_in_interval = checkpoint_in_interval_;
  c.stall_ns.assign(stall_ns_window_.begin(), stall_ns_window_.end());
  c.latency_ns.assign(latency_ns_window_.begin(), latency_ns_window_.end());
  c.taken = state_.taken;
  c.last_asked = last_asked_;
  if (run_start_) {
    c.elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Now() - *run_start_).count();
  }
  c.end = end_;
  c.plans = state_.plans;
  c.last_plan_iteration = last_plan_iteration_;
  c.timings_moved = timings_moved_;
  if (state_.plans > 0) {
    c.plan_iteration = plan_iteration_;
    c.plan_end = plan_problem_.end;
    c.plan_t_train_ns = plan_problem_.t_train_ns;
    c.plan_t_p_ns = plan_problem_.t_p_ns;
    c.plan_t_c_ns = plan_problem_.t_c_ns;
  }
  return c;
}

Status Scheduler::Resume(const SchedulerCheckpoint& c) {
  auto bad = [](std::string what) { return Status::InvalidArgument("scheduler resume: " + what); };
  if (!c.losses.empty()) {
    Status losses = ValidateLossSamples(c.losses);
    if (!losses.ok()) return losses.WithContext("scheduler resume: losses");
  }
  for (size_t i = 0; i < c.intervals.size(); ++i) {
    if (c.intervals[i].since_checkpoint < -1 || c.intervals[i].ns_per_iteration <= 0) {
      return bad(fmt::format("intervals[{}] = ({}, {}): since_checkpoint must be >= -1, ns_per_iteration > 0", i,
                             c.intervals[i].since_checkpoint, c.intervals[i].ns_per_iteration));
    }
  }
  if (c.since_checkpoint < -1) return bad(fmt::format("since_checkpoint = {} must be >= -1", c.since_checkpoint));
  for (const auto* window : {&c.stall_ns, &c.latency_ns})
    for (int64_t v : *window)
      if (v < 0) return bad(fmt::format("a reported time of {} ns is negative", v));
  for (size_t i = 1; i < c.taken.size(); ++i)
    if (c.taken[i] <= c.taken[i - 1]) return bad(fmt::format("taken[{}] = {} does not increase", i, c.taken[i]));
  const int64_t last = c.losses.empty() ? -1 : c.losses.back().iteration;
  if (c.end <= options_.warmup_end) return bad(fmt::format("end = {} must be > warmup_end = {}", c.end, options_.warmup_end));
  if (c.plans < 0) return bad(fmt::format("plans = {} must be >= 0", c.plans));
  if (c.plans > 0) {
    if (c.plan_iteration < options_.warmup_end || c.plan_iteration > last) {
      return bad(fmt::format("plan_iteration = {} must be in [warmup_end = {}, the last loss's iteration {}]",
                             c.plan_iteration, options_.warmup_end, last));
    }
    if (c.plan_end <= options_.warmup_end || c.plan_t_train_ns <= 0 || c.plan_t_p_ns < 0 || c.plan_t_c_ns < 0) {
      return bad(fmt::format("the plan's problem (end {}, t_train {} ns, t_p {} ns, t_c {} ns) is not valid", c.plan_end,
                             c.plan_t_train_ns, c.plan_t_p_ns, c.plan_t_c_ns));
    }
  }

  // Built aside and moved in only when complete: a checkpoint that fails changes nothing.
  Scheduler n(options_);
  for (const auto& i : c.intervals) n.intervals_.push_back({i.since_checkpoint, i.ns_per_iteration});
  while (n.intervals_.size() > kIntervalWindow) n.intervals_.pop_front();
  n.since_checkpoint_ = c.since_checkpoint;
  n.checkpoint_in_interval_ = c.checkpoint_in_interval;
  n.stall_ns_window_.assign(c.stall_ns.begin(), c.stall_ns.end());
  while (n.stall_ns_window_.size() > kReportWindow) n.stall_ns_window_.pop_front();
  n.latency_ns_window_.assign(c.latency_ns.begin(), c.latency_ns.end());
  while (n.latency_ns_window_.size() > kReportWindow) n.latency_ns_window_.pop_front();
  n.last_asked_ = c.last_asked;
  // last_time_ stays unset: the interval across the restart is not a training interval.
  if (c.elapsed_ns >= 0) n.run_start_ = n.Now() - std::chrono::nanoseconds(c.elapsed_ns);
  n.state_ = SchedulerState{};

  // Re-make the last successful plan where it was made: the losses up to it, the estimates and
  // the end it used, the checkpoints taken by then; then drop what was answered since.
  if (c.plans > 0) {
    n.samples_.clear();
    for (const LossSample& l : c.losses)
      if (l.iteration <= c.plan_iteration) n.samples_.push_back(l);
    n.end_ = c.plan_end;
    n.state_.t_train_ns = c.plan_t_train_ns;
    n.state_.t_p_ns = c.plan_t_p_ns;
    n.state_.t_c_ns = c.plan_t_c_ns;
    for (int64_t t : c.taken)
      if (t <= c.plan_iteration) n.state_.taken.push_back(t);
    n.state_.plans = c.plans - 1;  // the fallback of a first plan is tried as it was then
    n.PlanLocked(c.plan_iteration, /*move_end=*/false);  // `n` is not shared: no lock needed
    if (n.state_.plans != c.plans) {
      const Status& why = n.state_.last_plan_status;
      return why.ok() ? bad("the saved plan could not be made again") : why.WithContext("scheduler resume");
    }
    std::erase_if(n.state_.planned, [&](int64_t it) { return it <= c.last_asked; });
  }
  n.samples_ = c.losses;
  n.end_ = c.end;
  n.state_.end = n.end_;
  n.state_.taken = c.taken;
  n.state_.iteration = last;
  n.state_.t_c_ns = n.latency_ns_window_.empty() ? options_.t_c_ns : Median(n.latency_ns_window_);
  n.state_.t_p_stall_ns = n.stall_ns_window_.empty() ? 0 : Mean(n.stall_ns_window_);
  n.state_.t_train_ns = n.TrainEstimateLocked();
  n.RefreshCheckpointCostLocked();
  n.last_plan_iteration_ = c.last_plan_iteration;
  n.timings_moved_ = c.timings_moved;

  std::lock_guard<std::mutex> lock(mu_);
  samples_ = std::move(n.samples_);
  last_time_.reset();
  run_start_ = n.run_start_;
  end_ = n.end_;
  intervals_ = std::move(n.intervals_);
  since_checkpoint_ = n.since_checkpoint_;
  stall_ns_window_ = std::move(n.stall_ns_window_);
  latency_ns_window_ = std::move(n.latency_ns_window_);
  checkpoint_in_interval_ = n.checkpoint_in_interval_;
  plan_curve_ = std::move(n.plan_curve_);
  last_asked_ = n.last_asked_;
  last_plan_iteration_ = n.last_plan_iteration_;
  plan_iteration_ = n.plan_iteration_;
  timings_moved_ = n.timings_moved_;
  plan_problem_ = n.plan_problem_;
  state_ = std::move(n.state_);
  return Status::OK();
}

Result<double> Scheduler::Evaluate(std::span<const int64_t> schedule) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.plans == 0) return Status::FailedPrecondition("scheduler: no plan yet (nothing to evaluate against)");
  return EvaluateCil(plan_problem_, plan_curve_, schedule);
}

}  // namespace viper
