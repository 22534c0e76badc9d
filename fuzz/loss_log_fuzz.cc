// libFuzzer target for the loss-log reader and what `viper schedule --loss-log FILE` does with a
// log it accepts: any byte string must parse or give an error, never crash or hang; a parsed log
// must pass the samples' own check; its fit (plain and robust) and every policy's schedule must
// end in an error or in a schedule of strictly increasing checkpoints in (s, e] with a finite CIL.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "viper/loss_fit.h"
#include "viper/schedule.h"

namespace {

void CheckSchedule(const viper::Schedule& s, const viper::ScheduleProblem& p) {
  if (!std::isfinite(s.cil)) std::abort();
  int64_t last = p.warmup_end;
  for (int64_t x : s.iterations) {
    if (x <= last || x > p.end) std::abort();
    last = x;
  }
}

void PlanFrom(std::span<const viper::LossSample> samples, const viper::FitOptions& fit) {
  viper::ScheduleProblem p;
  // The warm-up ends at the last logged iteration, bounded so that the run's times fit in int64
  // nanoseconds (the CLI's own checks are not what this target exercises).
  p.warmup_end = std::min<int64_t>(samples.back().iteration, 1'000'000'000);
  p.end = p.warmup_end + 300;
  p.t_train_ns = 50'000'000;
  p.t_p_ns = 500'000'000;
  p.t_c_ns = 1'000'000'000;
  p.t_infer_ns = 200'000'000;
  p.requests = 5000;
  auto fitted = viper::FitScheduleInputs(samples, p, /*epoch=*/40, fit);
  if (!fitted.ok()) return;
  if (!fitted->inputs.curve.valid()) std::abort();  // accepted means a curve to plan with
  fitted->inputs.optimal.max_cells = 20'000;        // keeps one input well under a millisecond
  for (std::string_view policy : viper::SchedulePolicies()) {
    auto schedule = viper::MakeSchedule(policy, fitted->inputs);
    if (schedule.ok()) CheckSchedule(*schedule, p);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // a longer log only costs time: the fit thins it to max_points
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto samples = viper::ParseLossLog(text, "fuzz");
  if (!samples.ok()) return 0;
  if (!viper::ValidateLossSamples(*samples).ok()) std::abort();  // the reader and the check agree
  PlanFrom(*samples, viper::FitOptions{});
  PlanFrom(*samples, viper::RobustFitOptions());
  return 0;
}
