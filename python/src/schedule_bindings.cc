// viper.Scheduler (the online Inference Performance Predictor, include/viper/scheduler.h) and
// viper.plan_schedules (what `viper schedule` computes, from a list of (iteration, loss) pairs).
// Times are seconds (floats) on the Python side and integer nanoseconds inside, as in the CLI.
#include <pybind11/stl.h>

#include <cmath>
#include <string>
#include <vector>

#include "bindings.h"
#include "viper/schedule.h"
#include "viper/scheduler.h"

namespace viper_py {
namespace {

using viper::Status;


std::vector<viper::LossSample> Samples(const std::vector<std::pair<int64_t, double>>& pairs) {
  std::vector<viper::LossSample> out;
  out.reserve(pairs.size());
  for (const auto& [iteration, loss] : pairs) out.push_back({iteration, loss});
  return out;
}

py::dict FitDict(const viper::LossFit& fit) {
  py::dict d;
  d["family"] = std::string(viper::loss_family_name(fit.curve.family()));
  d["formula"] = fit.curve.ToString();
  py::dict params;
  for (const auto& [name, value] : fit.curve.parameters()) params[py::str(name)] = value;
  d["parameters"] = params;
  d["mse"] = fit.mse;
  d["smoothing_window"] = fit.smoothing_window;
  return d;
}

py::dict StateDict(const viper::SchedulerState& s) {
  py::dict d;
  d["iteration"] = s.iteration;
  d["end"] = s.end;
  d["t_train"] = NsToSeconds(s.t_train_ns);
  d["t_p"] = NsToSeconds(s.t_p_ns);
  d["t_c"] = NsToSeconds(s.t_c_ns);
  d["t_p_stall"] = NsToSeconds(s.t_p_stall_ns);
  d["t_p_measured"] = NsToSeconds(s.t_p_measured_ns);
  d["fit"] = s.fit ? py::object(FitDict(*s.fit)) : py::none();
  d["plan_source"] = s.plan_source;
  d["taken"] = s.taken;
  d["planned"] = s.planned;
  d["predicted_cil"] = s.predicted_cil;
  d["plans"] = s.plans;
  d["last_plan_status"] = s.last_plan_status.ok() ? py::object(py::none()) : py::object(py::str(s.last_plan_status.ToString()));
  return d;
}

py::dict ScheduleDict(const viper::Schedule& s) {
  py::dict d;
  d["name"] = s.policy;
  d["cil"] = s.cil;
  d["checkpoints"] = s.checkpoints();
  d["schedule"] = s.iterations;
  d["interval"] = s.interval;
  d["stride"] = s.stride;
  return d;
}

}  // namespace

void BindSchedule(py::module_& m) {
  py::class_<viper::Scheduler, std::shared_ptr<viper::Scheduler>>(
      m, "Scheduler",
      "The online Inference Performance Predictor: fed (iteration, loss) every training step, it fits the loss "
      "curve at warmup_end, plans the checkpoints that minimise the consumers' cumulative inference loss, re-plans "
      "periodically with the measured time per iteration and the reported checkpoint costs, and answers "
      "should_checkpoint(iteration). Pass it to viper.Publisher(scheduler=...) and call publish_if_due(). "
      "Times are seconds. Thread-safe.")
      .def(py::init([](const std::string& policy, int64_t warmup_end, int64_t end, int64_t epoch, double t_infer,
                       int64_t requests, double t_train, double t_p, double t_c, int64_t refit_every,
                       bool checkpoint_at_warmup_end, bool measure_t_train,
                       const std::vector<std::pair<int64_t, double>>& history, bool robust_fit, double duration,
                       int64_t checkpoint_cost_intervals) {
             viper::SchedulerOptions o;
             o.policy = policy;
             o.warmup_end = warmup_end;
             o.end = end;
             o.epoch = epoch;
             o.t_infer_ns = SecondsToNs(t_infer, "t_infer", /*allow_zero=*/false);
             o.requests = requests;
             o.t_train_ns = SecondsToNs(t_train, "t_train", true);
             o.t_p_ns = SecondsToNs(t_p, "t_p", true);
             o.t_c_ns = SecondsToNs(t_c, "t_c", true);
             o.refit_every = refit_every;
             o.checkpoint_at_warmup_end = checkpoint_at_warmup_end;
             o.measure_t_train = measure_t_train;
             o.history = Samples(history);
             if (!robust_fit) o.fit = viper::FitOptions{};
             o.duration_ns = SecondsToNs(duration, "duration", true);
             o.checkpoint_cost_intervals = checkpoint_cost_intervals;
             std::unique_ptr<viper::Scheduler> created = Unwrap(viper::Scheduler::Create(std::move(o)));
             return std::shared_ptr<viper::Scheduler>(std::move(created));
           }),
           py::arg("policy") = "optimal", py::kw_only(), py::arg("warmup_end"), py::arg("end"), py::arg("epoch") = 0,
           py::arg("t_infer"), py::arg("requests"), py::arg("t_train") = 0.0, py::arg("t_p") = 0.0,
           py::arg("t_c") = 0.0, py::arg("refit_every") = 0, py::arg("checkpoint_at_warmup_end") = true,
           py::arg("measure_t_train") = true, py::arg("history") = std::vector<std::pair<int64_t, double>>{},
           py::arg("robust_fit") = true, py::arg("duration") = 0.0,
           py::arg("checkpoint_cost_intervals") = 3,
           "policy: one of none, epoch, fixed, greedy, sqrt, optimal. warmup_end (s) < end (e): iterations. "
           "t_infer: seconds between inference requests; requests: how many in all. t_train: seconds per iteration, "
           "the estimate until 8 intervals between observe() calls are measured (measure_t_train=False: used as "
           "given); t_p: what one checkpoint costs the training in all (its stall and the slower iterations after it), "
           "the estimate until the run measures it (the larger of the reported stalls and the excess of the "
           "checkpoint_cost_intervals intervals after a checkpoint over the clean time per iteration; 0 = stalls "
           "only); t_c: initial estimate of the update latency (replaced by reports). "
           "history: (iteration, loss) pairs seen before the scheduler existed (a warm-up): if they reach "
           "warmup_end the plan exists at once (state()['predicted_cil'] is the prediction before the run). "
           "robust_fit=False: plain least-squares family selection, unbounded extrapolation. duration > 0: the run "
           "ends that many seconds after the first observe(), and each plan moves `end` to now + time left / t_train.")
      .def("observe", [](viper::Scheduler& s, int64_t iteration, double loss) {
             ThrowIfError(s.Observe(iteration, loss));
           }, py::arg("iteration"), py::arg("loss"),
           "Records the loss after `iteration` (strictly increasing; finite loss, else ValueError). Plans at "
           "warmup_end and re-plans every refit_every iterations.")
      .def("should_checkpoint", &viper::Scheduler::ShouldCheckpoint, py::arg("iteration"),
           "True if a checkpoint is due after `iteration` (a planned one in (previous asked, iteration]).")
      .def("step", [](viper::Scheduler& s, int64_t iteration, double loss) { return Unwrap(s.Step(iteration, loss)); },
           py::arg("iteration"), py::arg("loss"), "observe() then should_checkpoint().")
      .def("report_publish_stall", [](viper::Scheduler& s, double seconds) {
             s.ReportPublishStall(std::chrono::nanoseconds(SecondsToNs(seconds, "seconds")));
           }, py::arg("seconds"),
           "The producer's stall for one publish (t_p); viper.Publisher reports it itself.")
      .def("report_update_latency", [](viper::Scheduler& s, double seconds) {
             s.ReportUpdateLatency(std::chrono::nanoseconds(SecondsToNs(seconds, "seconds")));
           }, py::arg("seconds"),
           "From the end of a publish's stall to the version live at a consumer (t_c).")
      .def("state", [](const viper::Scheduler& s) { return StateDict(s.state()); },
           "A dict: iteration, t_train, t_p, t_c, t_p_stall (mean reported stall), t_p_measured (whole cost of a "
           "checkpoint as measured, 0 until then) (seconds), fit (family, formula, parameters, mse) or None, "
           "plan_source ('fit', 'observed interval N' when no family fitted, '' before any plan), taken, planned, "
           "predicted_cil, plans, last_plan_status (None when the last plan succeeded).")
      .def("_checkpoint", [](const viper::Scheduler& s) {
             viper::SchedulerCheckpoint c = s.Checkpoint();
             py::dict d;
             py::list losses, intervals;
             for (const auto& l : c.losses) losses.append(py::make_tuple(l.iteration, l.loss));
             for (const auto& i : c.intervals) intervals.append(py::make_tuple(i.since_checkpoint, i.ns_per_iteration));
             d["losses"] = losses;
             d["intervals"] = intervals;
             d["since_checkpoint"] = c.since_checkpoint;
             d["checkpoint_in_interval"] = c.checkpoint_in_interval;
             d["stall_ns"] = c.stall_ns;
             d["latency_ns"] = c.latency_ns;
             d["taken"] = c.taken;
             d["last_asked"] = c.last_asked;
             d["elapsed_ns"] = c.elapsed_ns;
             d["end"] = c.end;
             d["plans"] = c.plans;
             d["last_plan_iteration"] = c.last_plan_iteration;
             d["timings_moved"] = c.timings_moved;
             d["plan_iteration"] = c.plan_iteration;
             d["plan_end"] = c.plan_end;
             d["plan_t_train_ns"] = c.plan_t_train_ns;
             d["plan_t_p_ns"] = c.plan_t_p_ns;
             d["plan_t_c_ns"] = c.plan_t_c_ns;
             return d;
           }, "What Scheduler.state_dict() holds (integers in ns; see include/viper/scheduler.h).")
      .def("_resume", [](viper::Scheduler& s, const std::vector<std::pair<int64_t, double>>& losses,
                         const std::vector<std::pair<int64_t, int64_t>>& intervals, int64_t since_checkpoint,
                         bool checkpoint_in_interval, std::vector<int64_t> stall_ns, std::vector<int64_t> latency_ns,
                         std::vector<int64_t> taken, int64_t last_asked, int64_t elapsed_ns, int64_t end, int64_t plans,
                         int64_t last_plan_iteration, bool timings_moved, int64_t plan_iteration, int64_t plan_end,
                         int64_t plan_t_train_ns, int64_t plan_t_p_ns, int64_t plan_t_c_ns) {
             viper::SchedulerCheckpoint c;
             c.losses = Samples(losses);
             for (const auto& [since, ns] : intervals) c.intervals.push_back({since, ns});
             c.since_checkpoint = since_checkpoint;
             c.checkpoint_in_interval = checkpoint_in_interval;
             c.stall_ns = std::move(stall_ns);
             c.latency_ns = std::move(latency_ns);
             c.taken = std::move(taken);
             c.last_asked = last_asked;
             c.elapsed_ns = elapsed_ns;
             c.end = end;
             c.plans = plans;
             c.last_plan_iteration = last_plan_iteration;
             c.timings_moved = timings_moved;
             c.plan_iteration = plan_iteration;
             c.plan_end = plan_end;
             c.plan_t_train_ns = plan_t_train_ns;
             c.plan_t_p_ns = plan_t_p_ns;
             c.plan_t_c_ns = plan_t_c_ns;
             ThrowIfError(s.Resume(c));
           }, py::kw_only(), py::arg("losses"), py::arg("intervals"), py::arg("since_checkpoint"),
           py::arg("checkpoint_in_interval"), py::arg("stall_ns"), py::arg("latency_ns"), py::arg("taken"),
           py::arg("last_asked"), py::arg("elapsed_ns"), py::arg("end"), py::arg("plans"),
           py::arg("last_plan_iteration"), py::arg("timings_moved"), py::arg("plan_iteration"), py::arg("plan_end"),
           py::arg("plan_t_train_ns"), py::arg("plan_t_p_ns"), py::arg("plan_t_c_ns"),
           "Resumes from _checkpoint()'s dict (Scheduler.load_state_dict()).")
      .def("evaluate", [](const viper::Scheduler& s, const std::vector<int64_t>& schedule) {
             return Unwrap(s.Evaluate(schedule));
           }, py::arg("schedule"),
           "Predicted CIL of a whole-run schedule (increasing iterations in (warmup_end, end]) under the current "
           "plan's curve and timing estimates, e.g. of an epoch baseline. Raises before the first plan.");

  m.def("plan_schedules", [](const std::vector<std::pair<int64_t, double>>& losses, int64_t warmup_end, int64_t end,
                             int64_t epoch, double t_train, double t_p, double t_c, double t_infer, int64_t requests,
                             std::vector<std::string> policies, bool robust_fit) {
          const std::vector<viper::LossSample> samples = Samples(losses);
          viper::ScheduleProblem problem;
          problem.warmup_end = warmup_end;
          problem.end = end;
          problem.t_train_ns = SecondsToNs(t_train, "t_train", false);
          problem.t_p_ns = SecondsToNs(t_p, "t_p", true);
          problem.t_c_ns = SecondsToNs(t_c, "t_c", true);
          problem.t_infer_ns = SecondsToNs(t_infer, "t_infer", false);
          problem.requests = requests;
          viper::FittedInputs fitted = Unwrap(viper::FitScheduleInputs(
              samples, problem, epoch, robust_fit ? viper::RobustFitOptions() : viper::FitOptions{}));
          if (policies.empty()) {
            for (std::string_view p : viper::SchedulePolicies()) {
              if (p == "epoch" && epoch <= 0) continue;  // needs an epoch length
              policies.emplace_back(p);
            }
          }
          py::list schedules;
          for (const auto& policy : policies) schedules.append(ScheduleDict(Unwrap(viper::MakeSchedule(policy, fitted.inputs))));
          py::dict out;
          out["fit"] = FitDict(fitted.fit);
          out["schedules"] = schedules;
          return out;
        },
        py::arg("losses"), py::kw_only(), py::arg("warmup_end"), py::arg("end"), py::arg("epoch") = 0,
        py::arg("t_train"), py::arg("t_p"), py::arg("t_c"), py::arg("t_infer"), py::arg("requests"),
        py::arg("policies") = std::vector<std::string>{}, py::arg("robust_fit") = false,
        "What `viper schedule` computes (robust_fit=True: with the online Scheduler's fit, `viper schedule --robust`): "
        "fits the (iteration, loss) pairs up to warmup_end and returns "
        "{'fit': {...}, 'schedules': [{'name', 'cil', 'checkpoints', 'schedule', ...}, ...]} for each policy "
        "(default: every policy; epoch only with epoch > 0). Times in seconds.");
}

}  // namespace viper_py
