// viper schedule: fits the warm-up part of a loss log and compares the checkpoint schedulers of
// the Inference Performance Predictor (none, epoch, fixed, greedy, sqrt, optimal) by predicted
// cumulative inference loss.
//
// Text output: the fit, then one line per scheduler. --json: one JSON array with one object per
// scheduler: {"name", "cil", "checkpoints", "schedule": [iterations...], "interval" (epoch,
// fixed), "stride" and "dp_cells" (optimal), "fit": {"family", "formula",
// "params": {...}, "mse", "samples", "smoothing_window"}}.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command.h"
#include "viper/loss_fit.h"
#include "viper/schedule.h"

namespace viper::cli {
namespace {

struct ScheduleFlags {
  std::string loss_log;
  int64_t warmup_end = 0, end = 0, epoch = 0, requests = 0;
  double t_train = 0, t_p = 0, t_c = 0, t_infer = 0;
  int64_t max_cells = OptimalOptions{}.max_cells;
  bool json = false;
  bool robust = false;
};

// Seconds (fractions allowed) to integer nanoseconds, with the flag named on error.
Result<int64_t> ToNanoseconds(double seconds, const char* flag, bool allow_zero) {
  if (!std::isfinite(seconds) || seconds < 0 || (!allow_zero && seconds == 0)) {
    return Status::InvalidArgument(fmt::format("{} {} must be a finite number of seconds {} 0", flag, seconds,
                                               allow_zero ? ">=" : ">"));
  }
  if (seconds * 1e9 >= 4.0e18) return Status::InvalidArgument(fmt::format("{} {} s is too large", flag, seconds));
  const int64_t ns = std::llround(seconds * 1e9);
  if (!allow_zero && ns == 0) return Status::InvalidArgument(fmt::format("{} {} s rounds to 0 ns", flag, seconds));
  return ns;
}

Result<ScheduleProblem> Problem(const ScheduleFlags& f) {
  ScheduleProblem p{.warmup_end = f.warmup_end, .end = f.end, .requests = f.requests};
  VIPER_ASSIGN_OR_RETURN(p.t_train_ns, ToNanoseconds(f.t_train, "--t-train", false));
  VIPER_ASSIGN_OR_RETURN(p.t_p_ns, ToNanoseconds(f.t_p, "--t-p", true));
  VIPER_ASSIGN_OR_RETURN(p.t_c_ns, ToNanoseconds(f.t_c, "--t-c", true));
  VIPER_ASSIGN_OR_RETURN(p.t_infer_ns, ToNanoseconds(f.t_infer, "--t-infer", false));
  VIPER_RETURN_IF_ERROR(ValidateProblem(p));
  if (f.epoch <= 0) return Status::InvalidArgument(fmt::format("--epoch {} must be > 0", f.epoch));
  return p;
}

std::string Summary(const std::vector<int64_t>& xs) {
  if (xs.empty()) return "-";
  constexpr size_t kHead = 5, kTail = 2;
  std::vector<std::string> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i < kHead || i + kTail >= xs.size()) parts.push_back(std::to_string(xs[i]));
    else if (i == kHead) parts.push_back("...");
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

std::string Details(const Schedule& s) {
  if (s.policy == "epoch" || s.policy == "fixed") return fmt::format("interval {}", s.interval);
  if (s.policy == "optimal") return fmt::format("stride {}, {} DP cells", s.stride, s.dp_cells);
  return "";
}

nlohmann::json FitJson(const LossFit& fit, size_t samples) {
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [name, value] : fit.curve.parameters()) params[name] = value;
  return {{"family", std::string(loss_family_name(fit.curve.family()))}, {"formula", fit.curve.ToString()},
          {"params", params}, {"mse", fit.mse}, {"samples", samples}, {"smoothing_window", fit.smoothing_window}};
}

void PrintJson(const std::vector<Schedule>& schedules, const LossFit& fit, size_t samples) {
  nlohmann::json out = nlohmann::json::array();
  for (const Schedule& s : schedules) {
    nlohmann::json o = {{"name", s.policy}, {"cil", s.cil}, {"checkpoints", s.checkpoints()},
                        {"schedule", s.iterations}, {"fit", FitJson(fit, samples)}};
    if (s.policy == "epoch" || s.policy == "fixed") o["interval"] = s.interval;
    if (s.policy == "optimal") o["stride"] = s.stride, o["dp_cells"] = s.dp_cells;
    out.push_back(std::move(o));
  }
  std::printf("%s\n", out.dump(2).c_str());
}

void PrintText(const std::vector<Schedule>& schedules, const LossFit& fit, const ScheduleFlags& f, size_t samples) {
  std::vector<std::string> params;
  for (const auto& [name, value] : fit.curve.parameters()) params.push_back(fmt::format("{}={:.10g}", name, value));
  std::printf("fit: %s  L(x) = %s  (%s)  mse %.4g on %zu samples up to iteration %lld, smoothing window %d\n",
              std::string(loss_family_name(fit.curve.family())).c_str(), fit.curve.ToString().c_str(),
              fmt::format("{}", fmt::join(params, ", ")).c_str(), fit.mse, samples,
              static_cast<long long>(f.warmup_end), fit.smoothing_window);
  for (const FamilyFit& c : fit.candidates) {
    if (c.accepted) {
      std::printf("  candidate %-7s mse %.4g  %s\n", std::string(loss_family_name(c.family)).c_str(), c.mse,
                  c.curve.ToString().c_str());
    } else {
      std::printf("  candidate %-7s rejected: %s\n", std::string(loss_family_name(c.family)).c_str(),
                  c.rejected_reason.c_str());
    }
  }
  std::printf("%-8s %11s %18s  %s\n", "policy", "checkpoints", "predicted CIL", "schedule");
  for (const Schedule& s : schedules) {
    const std::string details = Details(s);
    std::printf("%-8s %11lld %18.6f  %s%s\n", s.policy.c_str(), static_cast<long long>(s.checkpoints()), s.cil,
                Summary(s.iterations).c_str(), details.empty() ? "" : fmt::format("  ({})", details).c_str());
  }
}

int RunSchedule(const ScheduleFlags& f) {
  Result<ScheduleProblem> problem = Problem(f);
  if (!problem.ok()) return Fail("schedule", problem.status());
  Result<std::vector<LossSample>> rows = ReadLossLog(f.loss_log);
  if (!rows.ok()) return Fail("schedule", rows.status());
  Result<FittedInputs> fitted = FitScheduleInputs(*rows, *problem, f.epoch, f.robust ? RobustFitOptions() : FitOptions{});
  if (!fitted.ok()) return Fail("schedule", fitted.status().WithContext(fmt::format("loss log {}", f.loss_log)));
  ScheduleInputs& in = fitted->inputs;
  in.optimal.max_cells = f.max_cells;
  std::vector<Schedule> schedules;
  for (std::string_view policy : SchedulePolicies()) {
    Result<Schedule> s = MakeSchedule(policy, in);
    if (!s.ok()) return Fail("schedule", s.status());
    schedules.push_back(std::move(s).value());
  }
  const size_t samples = fitted->samples;
  if (f.json) PrintJson(schedules, fitted->fit, samples);
  else PrintText(schedules, fitted->fit, f, samples);
  return 0;
}

ViperCommand schedule_command(
    "schedule", "Predict the loss curve and compare checkpoint schedules (IPP)",
    [](CLI::App& app) -> RunFn {
      auto f = std::make_shared<ScheduleFlags>();
      app.add_option("--loss-log", f->loss_log, "CSV with header 'iteration,loss'; rows up to --warmup-end are fitted")
          ->required()
          ->check(PathText());
      app.add_option("--warmup-end", f->warmup_end, "Warm-up end iteration s (its model is live at time 0)")
          ->required()
          ->check(NonNegativeInteger());
      app.add_option("--end", f->end, "Last training iteration e (> s)")->required()->check(NonNegativeInteger());
      app.add_option("--epoch", f->epoch, "Iterations per epoch (the epoch baseline's interval)")
          ->required()
          ->check(NonNegativeInteger());
      app.add_option("--t-train", f->t_train, "Seconds per training iteration (> 0)")->required()->check(Number());
      app.add_option("--t-p", f->t_p, "Producer stall per checkpoint, seconds (>= 0)")->required()->check(Number());
      app.add_option("--t-c", f->t_c, "Seconds from the end of the stall until live at the consumer (>= 0)")
          ->required()
          ->check(Number());
      app.add_option("--t-infer", f->t_infer, "Seconds between inference requests (> 0)")->required()->check(Number());
      app.add_option("--requests", f->requests, "Number of inference requests M (> 0)")
          ->required()
          ->check(NonNegativeInteger());
      app.add_option("--max-cells", f->max_cells, "Work bound of the optimal scheduler (DP cells)")
          ->default_val(OptimalOptions{}.max_cells)
          ->check(PositiveInteger());
      app.add_flag("--json", f->json, "One JSON array, one object per scheduler");
      app.add_flag("--robust", f->robust,
                   "Fit as the online Scheduler does: family by held-out extrapolation error, monotone guard, "
                   "extrapolation bounded to 2x the warm-up");
      return [f] { return RunSchedule(*f); };
    },
    60);

}  // namespace
}  // namespace viper::cli
