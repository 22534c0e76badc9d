// viper::Scheduler: the online IPP (see include/viper/scheduler.h).
#include "viper/scheduler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "viper/log.h"

namespace viper {

namespace {

constexpr size_t kTrainWindow = 64;
constexpr size_t kReportWindow = 16;

int64_t Median(const std::deque<int64_t>& window) {
  std::vector<int64_t> v(window.begin(), window.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Push(std::deque<int64_t>& window, int64_t value, size_t limit) {
  window.push_back(value);
  if (window.size() > limit) window.pop_front();
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
  if (o.t_train_ns < 0 || o.t_p_ns < 0 || o.t_c_ns < 0) {
    return Status::InvalidArgument(fmt::format("scheduler: times must be >= 0 (t_train_ns = {}, t_p_ns = {}, t_c_ns = {})",
                                               o.t_train_ns, o.t_p_ns, o.t_c_ns));
  }
  if (o.refit_every < 0) return Status::InvalidArgument(fmt::format("scheduler: refit_every = {} must be >= 0", o.refit_every));
  if (o.epoch < 0 || (o.policy == "epoch" && o.epoch == 0)) {
    return Status::InvalidArgument(fmt::format("scheduler: epoch = {} must be > 0 for policy 'epoch'", o.epoch));
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::Create(SchedulerOptions options) {
  VIPER_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.refit_every == 0) options.refit_every = std::max<int64_t>(1, (options.end - options.warmup_end) / 10);
  options.fit.horizon = options.end;
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(options)));
}

Scheduler::Scheduler(SchedulerOptions options) : options_(std::move(options)) {
  state_.t_p_ns = options_.t_p_ns;
  state_.t_c_ns = options_.t_c_ns;
  state_.t_train_ns = options_.t_train_ns;
}

Status Scheduler::observe(int64_t iteration, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!std::isfinite(loss)) {
    return Status::InvalidArgument(fmt::format("scheduler: loss {} at iteration {} is not finite", loss, iteration));
  }
  if (iteration < 0 || (!samples_.empty() && iteration <= samples_.back().iteration)) {
    return Status::InvalidArgument(fmt::format("scheduler: iteration {} does not follow {} (must increase)", iteration,
                                               samples_.empty() ? -1 : samples_.back().iteration));
  }
  MeasureLocked(iteration);
  samples_.push_back({iteration, loss});
  state_.iteration = iteration;
  if (PlanDueLocked(iteration)) PlanLocked(iteration);
  return Status::OK();
}

void Scheduler::MeasureLocked(int64_t iteration) {
  const auto now = std::chrono::steady_clock::now();
  if (last_time_ && !samples_.empty()) {
    const int64_t dt = std::chrono::duration_cast<std::chrono::nanoseconds>(now - *last_time_).count();
    Push(train_ns_window_, std::max<int64_t>(1, dt / (iteration - samples_.back().iteration)), kTrainWindow);
  }
  last_time_ = now;
}

int64_t Scheduler::TrainEstimateLocked() const {
  if (options_.t_train_ns > 0) return options_.t_train_ns;
  return train_ns_window_.empty() ? 0 : Median(train_ns_window_);
}

bool Scheduler::PlanDueLocked(int64_t iteration) const {
  if (iteration < options_.warmup_end || iteration >= options_.end) return false;
  // Until a plan succeeds (e.g. t_train still unmeasured) every observation retries.
  return state_.plans == 0 || iteration - last_plan_iteration_ >= options_.refit_every || timings_moved_;
}

Result<ScheduleInputs> Scheduler::InputsLocked(int64_t iteration) {
  ScheduleInputs in;
  in.problem = {options_.warmup_end, options_.end, TrainEstimateLocked(), state_.t_p_ns, state_.t_c_ns,
                options_.t_infer_ns, options_.requests};
  if (in.problem.t_train_ns <= 0) {
    return Status::FailedPrecondition("scheduler: t_train unknown (options.t_train_ns = 0 and fewer than two observe() calls)");
  }
  Result<LossFit> fit = FitLossCurve(samples_, options_.fit);
  if (!fit.ok()) return fit.status().WithContext(fmt::format("scheduler: refit at iteration {}", iteration));
  state_.fit = std::move(fit).value();
  in.curve = state_.fit->curve;
  in.epoch = options_.epoch;
  for (const LossSample& s : samples_) {
    if (s.iteration <= options_.warmup_end) in.warmup_losses.push_back(s.loss);
  }
  in.optimal = options_.optimal;
  in.now = iteration;
  in.taken = state_.taken;
  return in;
}

void Scheduler::PlanLocked(int64_t iteration) {
  last_plan_iteration_ = iteration;
  timings_moved_ = false;
  Result<ScheduleInputs> in = InputsLocked(iteration);
  Result<Schedule> plan = in.ok() ? MakeSchedule(options_.policy, *in) : Result<Schedule>(in.status());
  if (!plan.ok()) {
    // Keep the previous plan; the next refit retries.
    if (plan.status().message() != state_.last_plan_status.message()) {
      log(LogLevel::kWarn, "schedule", "plan at iteration {} failed (keeping the previous plan): {}", iteration,
          plan.status().message());
    }
    state_.last_plan_status = plan.status();
    return;
  }
  state_.t_train_ns = in->problem.t_train_ns;
  plan_t_p_ns_ = in->problem.t_p_ns;
  plan_t_c_ns_ = in->problem.t_c_ns;
  state_.planned.assign(plan->iterations.begin() + static_cast<std::ptrdiff_t>(in->taken.size()), plan->iterations.end());
  state_.predicted_cil = plan->cil;
  state_.last_plan_status = Status::OK();
  ++state_.plans;
}

bool Scheduler::should_checkpoint(int64_t iteration) {
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
  if (state_.plans == 0 && from < options_.end && options_.end <= iteration) planned_due = true;
  if (planned_due && iteration > options_.warmup_end && iteration <= options_.end &&
      (state_.taken.empty() || iteration > state_.taken.back())) {
    state_.taken.push_back(iteration);
  }
  return warmup_model || planned_due;
}

Result<bool> Scheduler::step(int64_t iteration, double loss) {
  VIPER_RETURN_IF_ERROR(observe(iteration, loss));
  return should_checkpoint(iteration);
}

void Scheduler::report_publish_stall(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Push(stall_ns_window_, std::llround(seconds * 1e9), kReportWindow);
  const int64_t estimate = Median(stall_ns_window_);
  if (state_.plans > 0 && Moved(plan_t_p_ns_, estimate)) timings_moved_ = true;
  state_.t_p_ns = estimate;
}

void Scheduler::report_update_latency(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Push(latency_ns_window_, std::llround(seconds * 1e9), kReportWindow);
  const int64_t estimate = Median(latency_ns_window_);
  if (state_.plans > 0 && Moved(plan_t_c_ns_, estimate)) timings_moved_ = true;
  state_.t_c_ns = estimate;
}

SchedulerState Scheduler::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

}  // namespace viper
