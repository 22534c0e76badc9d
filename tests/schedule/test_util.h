// Shared fixtures of the schedule tests: the worked example (L(x) = 2*exp(-0.01*x) + 0.1, s = 100,
// e = 400, M = 5000, t_train 100 ms, t_p 500 ms, t_c 300 ms, t_infer 10 ms; docs/ARCHITECTURE.md
// "The CIL model, in integer time") and a brute-force oracle.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "viper/schedule.h"

namespace viper::testing {

// L(x) = 2*exp(-0.01*x) + 0.1, s = 100, e = 400, M = 5000, t_train = 100 ms, t_p = 500 ms,
// t_c = 300 ms, t_infer = 10 ms.
inline ScheduleProblem WorkedProblem() {
  return {.warmup_end = 100, .end = 400, .t_train_ns = 100'000'000, .t_p_ns = 500'000'000,
          .t_c_ns = 300'000'000, .t_infer_ns = 10'000'000, .requests = 5000};
}
inline LossCurve WorkedCurve() { return LossCurve::ExpOffset(2.0, 0.01, 0.1); }
inline ScheduleInputs WorkedInputs() {
  ScheduleInputs in;
  in.problem = WorkedProblem();
  in.curve = WorkedCurve();
  in.epoch = 50;
  return in;
}

// Minimum CIL over every subset of (now, e] appended to `taken` (2^(e-now) subsets).
struct BruteForce {
  double cil = std::numeric_limits<double>::infinity();
  std::vector<int64_t> schedule;
};
inline BruteForce BruteForceOptimum(const ScheduleProblem& p, const LossCurve& curve,
                                    const std::vector<int64_t>& taken = {}, int64_t now = -1) {
  const int64_t start = now < 0 ? p.warmup_end : now;
  const int64_t n = p.end - start;
  BruteForce best;
  for (uint64_t mask = 0; mask < (uint64_t{1} << n); ++mask) {
    std::vector<int64_t> schedule = taken;
    for (int64_t i = 0; i < n; ++i) {
      if (mask & (uint64_t{1} << i)) schedule.push_back(start + 1 + i);
    }
    Result<double> cil = EvaluateCil(p, curve, schedule);
    if (cil.ok() && *cil < best.cil) best = {*cil, schedule};
  }
  return best;
}

}  // namespace viper::testing
