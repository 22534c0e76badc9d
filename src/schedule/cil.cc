// The exact CIL model in integer time, and validation of scheduler inputs.
#include <cmath>

#include <fmt/format.h>

#include "schedule_internal.h"

namespace viper {

namespace {

// Keeps every live time below 2^62, so sums of two of them cannot overflow either.
constexpr __int128 kTimeLimit = static_cast<__int128>(1) << 62;

Status CheckTimes(const ScheduleProblem& p) {
  if (p.t_train_ns <= 0) return Status::InvalidArgument(fmt::format("schedule: t_train = {} ns must be > 0", p.t_train_ns));
  if (p.t_infer_ns <= 0) return Status::InvalidArgument(fmt::format("schedule: t_infer = {} ns must be > 0", p.t_infer_ns));
  if (p.t_p_ns < 0) return Status::InvalidArgument(fmt::format("schedule: t_p = {} ns must be >= 0", p.t_p_ns));
  if (p.t_c_ns < 0) return Status::InvalidArgument(fmt::format("schedule: t_c = {} ns must be >= 0", p.t_c_ns));
  const __int128 n = p.end - p.warmup_end;
  const __int128 worst = n * p.t_train_ns + n * p.t_p_ns + p.t_c_ns;
  if (worst >= kTimeLimit || static_cast<__int128>(p.requests) * p.t_infer_ns >= kTimeLimit) {
    return Status::InvalidArgument("schedule: times too large (training or request span beyond 2^62 ns)");
  }
  return Status::OK();
}

}  // namespace

Status ValidateProblem(const ScheduleProblem& p) {
  if (p.warmup_end < 0) return Status::InvalidArgument(fmt::format("schedule: warm-up end s = {} must be >= 0", p.warmup_end));
  if (p.end <= p.warmup_end) {
    return Status::InvalidArgument(
        fmt::format("schedule: end e = {} must be greater than the warm-up end s = {}", p.end, p.warmup_end));
  }
  if (p.requests <= 0) return Status::InvalidArgument(fmt::format("schedule: requests M = {} must be > 0", p.requests));
  return CheckTimes(p);
}

int64_t RequestsBefore(const ScheduleProblem& p, int64_t t_ns) {
  if (t_ns <= 0) return 0;
  const int64_t n = t_ns / p.t_infer_ns + (t_ns % p.t_infer_ns != 0 ? 1 : 0);  // ceil, in integers
  return n < p.requests ? n : p.requests;
}

namespace schedule_internal {

double CilModel::Cil(std::span<const int64_t> schedule) const {
  // CIL = sum_{k=0..n} L(x_k) * (N(T_{k+1}) - N(T_k)), x_0 = s, N(T_0) = 0, N(T_{n+1}) = M.
  long double total = 0;
  int64_t served = 0;  // N(T_k)
  double loss = L(p_.warmup_end);
  for (size_t k = 0; k < schedule.size() && served < p_.requests; ++k) {
    const int64_t next = Requests(LiveTime(schedule[k], static_cast<int64_t>(k) + 1));
    total += static_cast<long double>(loss) * (next - served);
    served = next;
    loss = L(schedule[k]);
  }
  total += static_cast<long double>(loss) * (p_.requests - served);
  return static_cast<double>(total);
}

int64_t CilModel::LastUsefulIteration(int64_t k) const {
  const __int128 room = static_cast<__int128>(p_.requests - 1) * p_.t_infer_ns - p_.t_c_ns -
                        static_cast<__int128>(k) * p_.t_p_ns;
  if (room < 0) return p_.warmup_end;
  const __int128 last = p_.warmup_end + room / p_.t_train_ns;
  return last > p_.end ? p_.end : static_cast<int64_t>(last);
}

Result<PlanStart> ValidateInputs(const ScheduleInputs& in) {
  const ScheduleProblem& p = in.problem;
  VIPER_RETURN_IF_ERROR(ValidateProblem(p));
  if (!in.curve.valid()) return Status::InvalidArgument("schedule: no loss curve given");
  PlanStart start{in.now < 0 ? p.warmup_end : in.now, p.warmup_end, 0};
  if (start.start < p.warmup_end || start.start > p.end) {
    return Status::InvalidArgument(
        fmt::format("schedule: now = {} is outside [s, e] = [{}, {}]", in.now, p.warmup_end, p.end));
  }
  for (size_t i = 0; i < in.taken.size(); ++i) {
    const int64_t x = in.taken[i];
    if (x <= p.warmup_end || x > start.start || (i > 0 && x <= in.taken[i - 1])) {
      return Status::InvalidArgument(fmt::format(
          "schedule: taken checkpoint {} (#{}) must be strictly increasing in (s, now] = ({}, {}]", x, i,
          p.warmup_end, start.start));
    }
  }
  if (!in.taken.empty()) start.anchor = in.taken.back();
  start.k0 = static_cast<int64_t>(in.taken.size());
  return start;
}

Result<Schedule> Finish(const ScheduleInputs& in, std::string policy, std::vector<int64_t> planned) {
  Schedule out;
  out.policy = std::move(policy);
  out.iterations = in.taken;
  out.iterations.insert(out.iterations.end(), planned.begin(), planned.end());
  out.cil = CilModel(in.problem, in.curve).Cil(out.iterations);
  if (!std::isfinite(out.cil)) {
    return Status::InvalidArgument(fmt::format("schedule {}: CIL is not finite: the curve {} gives a non-finite "
                                               "loss on the schedule (e.g. a power law at iteration 0)",
                                               out.policy, in.curve.ToString()));
  }
  return out;
}

}  // namespace schedule_internal

Result<double> EvaluateCil(const ScheduleProblem& problem, const LossCurve& curve, std::span<const int64_t> schedule) {
  VIPER_RETURN_IF_ERROR(ValidateProblem(problem));
  if (!curve.valid()) return Status::InvalidArgument("CIL: no loss curve given");
  for (size_t i = 0; i < schedule.size(); ++i) {
    const int64_t x = schedule[i];
    if (x <= problem.warmup_end || x > problem.end || (i > 0 && x <= schedule[i - 1])) {
      return Status::InvalidArgument(fmt::format("CIL: checkpoint {} (#{}) must be strictly increasing in (s, e] = "
                                                 "({}, {}]",
                                                 x, i, problem.warmup_end, problem.end));
    }
  }
  const double cil = schedule_internal::CilModel(problem, curve).Cil(schedule);
  if (!std::isfinite(cil)) {
    return Status::InvalidArgument(
        fmt::format("CIL: not finite: the curve {} gives a non-finite loss on the schedule", curve.ToString()));
  }
  return cil;
}

}  // namespace viper
