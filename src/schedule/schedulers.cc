// The heuristic schedulers (none, epoch, fixed, greedy, sqrt) and the policy dispatch.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schedule_internal.h"

namespace viper {

using schedule_internal::CilModel;
using schedule_internal::Finish;
using schedule_internal::PlanStart;
using schedule_internal::ValidateInputs;

namespace {

// anchor + I, anchor + 2I, ... restricted to (start, e].
std::vector<int64_t> EveryInterval(const PlanStart& st, int64_t end, int64_t interval) {
  std::vector<int64_t> out;
  int64_t x = st.anchor + interval;
  if (x <= st.start) x += ((st.start - x) / interval + 1) * interval;
  for (; x <= end; x += interval) out.push_back(x);
  return out;
}

// Gap (iterations) of the sqrt rule at x.
int64_t SqrtGap(const CilModel& m, int64_t x, int64_t lower) {
  const ScheduleProblem& p = m.problem();
  const double drop = m.L(x) - m.L(p.end);
  const double slope = std::abs(m.curve().derivative(static_cast<double>(x)));
  const double remaining = static_cast<double>(p.end - x);
  // No improvement left (or a flat/increasing curve): only the final checkpoint at e is useful.
  if (!(drop > 0) || !(slope > 0)) return std::max<int64_t>(lower, p.end - x);
  const double h = std::sqrt(2.0 * static_cast<double>(p.t_p_ns) * drop / (static_cast<double>(p.t_train_ns) * slope));
  if (!std::isfinite(h) || h >= remaining) return std::max<int64_t>(lower, p.end - x);
  return std::max<int64_t>(lower, std::llround(h));
}

}  // namespace

Result<Schedule> NoSchedule(const ScheduleInputs& in) {
  VIPER_RETURN_IF_ERROR(ValidateInputs(in));
  return Finish(in, "none", {});
}

Result<Schedule> EpochSchedule(const ScheduleInputs& in) {
  VIPER_ASSIGN_OR_RETURN(PlanStart st, ValidateInputs(in));
  if (in.epoch <= 0) return Status::InvalidArgument(fmt::format("epoch schedule: epoch = {} must be > 0", in.epoch));
  VIPER_ASSIGN_OR_RETURN(Schedule out, Finish(in, "epoch", EveryInterval(st, in.problem.end, in.epoch)));
  out.interval = in.epoch;
  return out;
}

Result<Schedule> FixedSchedule(const ScheduleInputs& in) {
  VIPER_ASSIGN_OR_RETURN(PlanStart st, ValidateInputs(in));
  const CilModel model(in.problem, in.curve);
  // Checkpoints after `useful` change nothing: they are left out of the evaluation, and every
  // interval whose first checkpoint lies beyond it ties with the first such interval.
  const int64_t useful = std::max(st.start, model.LastUsefulIteration(st.k0 + 1));
  const int64_t max_interval = std::min(in.problem.end - st.anchor, useful - st.anchor + 1);
  std::vector<int64_t> full = in.taken;
  int64_t best_interval = 0;
  double best = std::numeric_limits<double>::infinity();
  for (int64_t interval = 1; interval <= max_interval; ++interval) {
    full.resize(in.taken.size());
    const std::vector<int64_t> planned = EveryInterval(st, useful, interval);
    full.insert(full.end(), planned.begin(), planned.end());
    const double cil = model.Cil(full);
    if (cil < best) best = cil, best_interval = interval;  // strict: ties keep the smaller interval
  }
  if (best_interval == 0) return Status::InvalidArgument("fixed schedule: no interval gives a finite CIL");
  VIPER_ASSIGN_OR_RETURN(Schedule out, Finish(in, "fixed", EveryInterval(st, in.problem.end, best_interval)));
  out.interval = best_interval;
  return out;
}

Result<Schedule> GreedySchedule(const ScheduleInputs& in) {
  VIPER_ASSIGN_OR_RETURN(PlanStart st, ValidateInputs(in));
  const ScheduleProblem& p = in.problem;
  const CilModel model(p, in.curve);
  // Requests per second of stall: a stall delays every later version by t_p.
  const double stall_requests = static_cast<double>(p.t_p_ns) / static_cast<double>(p.t_infer_ns);
  std::vector<int64_t> planned;
  int64_t anchor = st.anchor, k = st.k0;
  int64_t useful = model.LastUsefulIteration(k + 1);
  double regret = 0;  // CIL lost since `anchor` by not having the newer model live
  // The walk starts at the last checkpoint so that a re-plan counts the regret already accrued;
  // a checkpoint due at or before `now` is taken at the first iteration after it.
  for (int64_t x = anchor + 1; x <= std::min(p.end, useful); ++x) {
    const int64_t arrivals = model.Requests(model.LiveTime(x, k + 1)) - model.Requests(model.LiveTime(x - 1, k + 1));
    regret += (model.L(anchor) - model.L(x)) * static_cast<double>(arrivals);
    const double cost = stall_requests * (model.L(x) - model.L(useful));
    if (x <= st.start || !(model.L(x) < model.L(anchor)) || !(regret >= cost)) continue;
    planned.push_back(x);
    anchor = x, regret = 0, ++k;
    useful = model.LastUsefulIteration(k + 1);
  }
  return Finish(in, "greedy", std::move(planned));
}

Result<Schedule> SqrtSchedule(const ScheduleInputs& in) {
  VIPER_ASSIGN_OR_RETURN(PlanStart st, ValidateInputs(in));
  const ScheduleProblem& p = in.problem;
  const CilModel model(p, in.curve);
  const int64_t wait = p.t_c_ns > p.t_p_ns ? (p.t_c_ns - p.t_p_ns + p.t_train_ns - 1) / p.t_train_ns : 0;
  const int64_t lower = std::max<int64_t>(1, wait);
  std::vector<int64_t> planned;
  if (st.start < p.end) {
    int64_t x = std::max(st.anchor + SqrtGap(model, st.anchor, lower), st.start + 1);
    while (x < p.end) {
      planned.push_back(x);
      x += SqrtGap(model, x, lower);
    }
    planned.push_back(p.end);
  }
  return Finish(in, "sqrt", std::move(planned));
}

Result<FittedInputs> FitScheduleInputs(std::span<const LossSample> samples, const ScheduleProblem& problem,
                                       int64_t epoch, FitOptions fit) {
  VIPER_RETURN_IF_ERROR(ValidateProblem(problem));
  VIPER_RETURN_IF_ERROR(ValidateLossSamples(samples));
  std::vector<LossSample> warmup;
  for (const LossSample& s : samples) {
    if (s.iteration <= problem.warmup_end) warmup.push_back(s);
  }
  if (warmup.empty()) {
    return Status::InvalidArgument(fmt::format("no loss sample at or before the warm-up end {} (the first is "
                                               "iteration {})",
                                               problem.warmup_end, samples.front().iteration));
  }
  fit.horizon = problem.end;
  FittedInputs out;
  VIPER_ASSIGN_OR_RETURN(out.fit, FitLossCurve(warmup, fit));
  out.inputs.problem = problem;
  out.inputs.curve = out.fit.curve;
  out.inputs.epoch = epoch;
  out.samples = warmup.size();
  return out;
}

std::span<const std::string_view> SchedulePolicies() {
  static constexpr std::array<std::string_view, 6> kPolicies = {"none", "epoch", "fixed", "greedy", "sqrt", "optimal"};
  return kPolicies;
}

Result<Schedule> MakeSchedule(std::string_view policy, const ScheduleInputs& in) {
  if (policy == "none") return NoSchedule(in);
  if (policy == "epoch") return EpochSchedule(in);
  if (policy == "fixed") return FixedSchedule(in);
  if (policy == "greedy") return GreedySchedule(in);
  if (policy == "sqrt") return SqrtSchedule(in);
  if (policy == "optimal") return OptimalSchedule(in);
  return Status::InvalidArgument(
      fmt::format("schedule: unknown policy '{}' (known: {})", policy, fmt::join(SchedulePolicies(), ", ")));
}

}  // namespace viper
