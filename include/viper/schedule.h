// Checkpoint schedules of the Inference Performance Predictor (IPP, docs/ARCHITECTURE.md): the
// exact cumulative-inference-loss (CIL) model and the five schedulers (epoch, fixed, greedy, sqrt,
// optimal). Pure functions of their inputs: thread-safe, no shared state.
//
// The model. Warm-up ends after iteration s (the model of iteration s is live at the consumers at
// time 0); training ends after iteration e. A schedule is x_1 < ... < x_n in (s, e]. Version k
// (the checkpoint after iteration x_k) is live at
//     T_k = (x_k - s)*t_train + k*t_p + t_c,  T_0 = 0,
// one request arrives every t_infer (at 0, t_infer, 2*t_infer, ...), M in all, so
//     N(T) = min(M, ceil(T / t_infer))
// requests arrive before T, and
//     CIL = sum_{k=0..n} L(x_k) * (N(T_{k+1}) - N(T_k)),  x_0 = s,  N(T_{n+1}) = M.
// Times are integer nanoseconds and N is computed with integer arithmetic: no floating-point
// floor ever decides which version serves a request.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/loss_fit.h"
#include "viper/status.h"

namespace viper {

struct ScheduleProblem {
  int64_t warmup_end = 0;  // s >= 0
  int64_t end = 0;         // e > s
  int64_t t_train_ns = 0;  // time per training iteration, > 0
  int64_t t_p_ns = 0;      // producer stall per checkpoint, >= 0
  int64_t t_c_ns = 0;      // end of the stall until live at the consumer, >= 0
  int64_t t_infer_ns = 0;  // one request every t_infer, > 0
  int64_t requests = 0;    // M > 0
};

// InvalidArgument naming the bad field: e <= s, s < 0, t_train or t_infer <= 0, t_p or t_c < 0,
// M <= 0, or times so large that T for n = e - s checkpoints would overflow 62 bits.
Status ValidateProblem(const ScheduleProblem& problem);

// N(T) = min(M, ceil(T / t_infer)) for T >= 0 (0 for T <= 0). REQUIRES: a valid problem.
int64_t RequestsBefore(const ScheduleProblem& problem, int64_t t_ns);

// Exact CIL of `schedule` (strictly increasing iterations in (s, e]; empty = no checkpoint).
// InvalidArgument for an invalid problem, curve or schedule, or a non-finite loss value.
Result<double> EvaluateCil(const ScheduleProblem& problem, const LossCurve& curve,
                           std::span<const int64_t> schedule);

struct OptimalOptions {
  // Upper bound on the DP cells (states (candidate, checkpoint count)) that one run of the
  // optimal scheduler visits; it picks the finest candidate stride that fits (see OptimalSchedule).
  // A cell costs ~25-50 ns on this machine kind and 4 bytes (its back-pointer): the default
  // bounds a run at ~0.5 s and 40 MB. A non-monotone curve (Li Chao path, ~8x the cost per cell)
  // gets max_cells / 8.
  int64_t max_cells = 10'000'000;
};

// Everything a scheduler needs. Plain struct; only `problem` and `curve` are always required.
struct ScheduleInputs {
  ScheduleProblem problem;
  LossCurve curve;  // predicted L(x), e.g. FitLossCurve(...).curve

  // "epoch": one checkpoint every `epoch` iterations (s + epoch, s + 2*epoch, ... <= e). > 0.
  int64_t epoch = 0;
  OptimalOptions optimal;

  // Re-planning in the middle of training (online mode). `taken` are the checkpoints already
  // taken (strictly increasing, in (s, now]); new checkpoints are planned in (now, e]. The default
  // (now = -1 meaning s, taken empty) plans the whole run. Results include `taken`.
  int64_t now = -1;
  std::vector<int64_t> taken;
};

struct Schedule {
  std::string policy;               // "none", "epoch", "fixed", "greedy", "sqrt" or "optimal"
  std::vector<int64_t> iterations;  // x_1 < ... < x_n in (s, e], including ScheduleInputs::taken
  double cil = 0.0;                 // exact CIL of `iterations`
  int64_t checkpoints() const { return static_cast<int64_t>(iterations.size()); }

  // Policy details (0 when not applicable).
  int64_t interval = 0;   // epoch, fixed: the constant interval
  int64_t stride = 0;     // optimal: candidate-grid stride (1 = every iteration)
  int64_t dp_cells = 0;   // optimal: DP states visited
};

// A loss log turned into scheduler inputs: the fit of its warm-up rows and the inputs built on it.
struct FittedInputs {
  LossFit fit;
  ScheduleInputs inputs;
  size_t samples = 0;  // warm-up rows fitted
};

// Fits the samples with iteration <= s (fit.horizon is set to e) and fills ScheduleInputs: the
// problem, the fitted curve and `epoch`. The pipeline of
// `viper schedule`; with MakeSchedule it gives the iterations of any policy from a loss log:
//   auto f = FitScheduleInputs(ReadLossLog(path).value(), problem, epoch);
//   auto s = MakeSchedule("sqrt", f->inputs);  // s->iterations
// InvalidArgument for an invalid problem, no sample at or before s, or no acceptable fit.
Result<FittedInputs> FitScheduleInputs(std::span<const LossSample> samples, const ScheduleProblem& problem,
                                       int64_t epoch = 0, FitOptions fit = {});

// The policy names accepted by MakeSchedule, in display order:
// "none", "epoch", "fixed", "greedy", "sqrt", "optimal".
std::span<const std::string_view> SchedulePolicies();

// Dispatches on `policy` (InvalidArgument for an unknown name, listing the known ones).
Result<Schedule> MakeSchedule(std::string_view policy, const ScheduleInputs& inputs);

// No checkpoint (the CIL of serving the warm-up model throughout).
Result<Schedule> NoSchedule(const ScheduleInputs& inputs);
// One checkpoint every inputs.epoch iterations counted from s (or from the last taken one).
Result<Schedule> EpochSchedule(const ScheduleInputs& inputs);
// The best constant interval I in 1..(e - s) by exhaustive search; checkpoints s + I, s + 2I, ...
// <= e (e is not appended). Ties go to the smaller interval. O(H log H) CIL terms, H = e - s or
// the last iteration whose checkpoint can still serve a request, whichever is smaller.
Result<Schedule> FixedSchedule(const ScheduleInputs& inputs);
// Checkpoints when the predicted CIL gain of checkpointing now beats waiting, as a rent-or-buy
// rule: walking x = s+1 .. e, it checkpoints at x once the regret of waiting (the CIL lost since
// the last checkpoint a because the consumers keep L(a) while training has reached L(x): the
// requests that arrived meanwhile times L(a) - L(y), summed) reaches the cost of a checkpoint (its
// stall makes every later version live t_p later: t_p / t_infer requests times the improvement
// L(x) - L(u) still to come, u = the last iteration whose checkpoint can serve a request). In the
// continuum limit the gaps it picks are those of the sqrt rule; it needs no look-ahead beyond
// L(u). O(e - s). See docs/ARCHITECTURE.md "greedy" for where it loses and why.
Result<Schedule> GreedySchedule(const ScheduleInputs& inputs);
// Gap rule h(x) = sqrt(2*t_p*(L(x) - L(e)) / (t_train*|L'(x)|)) rounded to the nearest
// iteration, at least 1 and at least ceil((t_c - t_p)/t_train); always checkpoints at e.
Result<Schedule> SqrtSchedule(const ScheduleInputs& inputs);
// The exact minimum of the CIL over schedules drawn from a candidate grid: every iteration when
// the work fits OptimalOptions::max_cells, else every `stride`-th from s (or now) plus e, with the
// finest power-of-two stride that fits. Dynamic programming over (candidate, number of
// checkpoints) with a convex-hull minimum per layer and exact dominance pruning: O(cells) time,
// cells <= G*K and about (live layers) x G in practice, 4 bytes per cell. With stride > 1,
// schedulers that use off-grid iterations can beat it (measured: by < 1e-4 relative).
// See docs/ARCHITECTURE.md "Inference Performance Predictor" for the algorithm and stride rule.
Result<Schedule> OptimalSchedule(const ScheduleInputs& inputs);

}  // namespace viper
