// Shared pieces of the schedulers: the integer-time CIL model once the inputs are validated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "viper/schedule.h"

namespace viper::schedule_internal {

// Validated problem + curve. All arithmetic on times is int64 (ValidateProblem bounds it).
class CilModel {
 public:
  CilModel(const ScheduleProblem& problem, const LossCurve& curve) : p_(problem), curve_(curve) {}

  const ScheduleProblem& problem() const { return p_; }
  const LossCurve& curve() const { return curve_; }
  double L(int64_t x) const { return curve_.value(static_cast<double>(x)); }
  // T_k for the k-th checkpoint (k >= 1) taken after iteration x.
  int64_t LiveTime(int64_t x, int64_t k) const { return (x - p_.warmup_end) * p_.t_train_ns + k * p_.t_p_ns + p_.t_c_ns; }
  int64_t Requests(int64_t t_ns) const { return RequestsBefore(p_, t_ns); }
  // CIL of a valid schedule (no checks). NaN if a loss value is not finite.
  double Cil(std::span<const int64_t> schedule) const;
  // The last iteration at which a k-th checkpoint can still serve a request (N(T) < M), capped
  // to [s, e]; s if none can. Checkpoints after it do not change the CIL.
  int64_t LastUsefulIteration(int64_t k) const;

 private:
  const ScheduleProblem& p_;
  const LossCurve& curve_;
};

// Where a plan starts: new checkpoints go in (start, e]; the last checkpoint so far is `anchor`
// (s if none) and `k0` checkpoints were taken before.
struct PlanStart {
  int64_t start = 0;
  int64_t anchor = 0;
  int64_t k0 = 0;
};

// Validates problem, curve, now and taken; InvalidArgument naming the bad field.
Result<PlanStart> ValidateInputs(const ScheduleInputs& inputs);

// Builds the Schedule for `policy`: taken + planned, with its exact CIL (InvalidArgument if a
// loss value on the schedule is not finite).
Result<Schedule> Finish(const ScheduleInputs& inputs, std::string policy, std::vector<int64_t> planned);

}  // namespace viper::schedule_internal
