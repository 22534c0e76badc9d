// viper_schedule_bench: time of the optimal scheduler at e - s = 100,000 iterations, against a
// baseline measured in the same run: one pass over as many DP cells that evaluates one line and
// stores one 4-byte back-pointer per cell (the least any DP over those cells must do).
//
// Usage: viper_schedule_bench [repetitions=3]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "viper/schedule.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Minimum time of `reps` runs of f.
template <typename F>
double Best(int reps, F&& f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, Seconds(t0));
  }
  return best;
}

double BaselineSeconds(int64_t cells, int reps) {
  std::vector<int32_t> parents(static_cast<size_t>(cells));
  volatile double sink = 0;
  const double t = Best(reps, [&] {
    double slope = 1.0, icpt = 0.0, acc = 0;
    for (int64_t c = 0; c < cells; ++c) {
      const double v = icpt + slope * static_cast<double>(c);
      acc += v;
      parents[static_cast<size_t>(c)] = static_cast<int32_t>(c);
      slope *= 0.9999999;
    }
    sink = acc + parents[static_cast<size_t>(cells / 2)];
  });
  (void)sink;
  return t;
}

struct Case {
  std::string name;
  viper::ScheduleInputs in;
};

std::vector<Case> Cases() {
  viper::ScheduleProblem p{.warmup_end = 1000, .end = 101'000, .t_train_ns = 100'000'000, .t_p_ns = 1'000'000'000,
                           .t_c_ns = 500'000'000, .t_infer_ns = 1'000'000, .requests = 11'000'000};
  std::vector<Case> cases;
  auto add = [&](std::string name, viper::ScheduleProblem prob, viper::LossCurve curve) {
    Case c{std::move(name), {}};
    c.in.problem = prob;
    c.in.curve = std::move(curve);
    cases.push_back(std::move(c));
  };
  add("exp+c, t_p=1s", p, viper::LossCurve::ExpOffset(2.0, 3e-5, 0.1));
  add("power, t_p=1s", p, viper::LossCurve::PowerLaw(3.0, 0.5, 0.2));
  viper::ScheduleProblem cheap = p;
  cheap.t_p_ns = 20'000'000;  // 20 ms stalls: hundreds of checkpoints pay off
  add("exp+c, t_p=20ms", cheap, viper::LossCurve::ExpOffset(2.0, 3e-5, 0.1));
  add("power, t_p=20ms", cheap, viper::LossCurve::PowerLaw(3.0, 0.5, 0.2));
  viper::ScheduleProblem tiny = p;
  tiny.t_p_ns = 500'000;  // 0.5 ms stalls: the optimum checkpoints at every candidate (worst case)
  add("exp+c, t_p=0.5ms", tiny, viper::LossCurve::ExpOffset(2.0, 3e-5, 0.1));
  viper::ScheduleProblem free_ckpt = p;
  free_ckpt.t_p_ns = 0;
  add("exp+c, t_p=0", free_ckpt, viper::LossCurve::ExpOffset(2.0, 3e-5, 0.1));
  add("non-monotone", p,
      viper::LossCurve::Custom([](double x) { return 1.0 + 0.5 * std::exp(-3e-5 * x) + 0.01 * std::sin(x / 500.0); }));
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  std::printf("optimal scheduler, e - s = 100000, max_cells = %lld (best of %d)\n",
              static_cast<long long>(viper::OptimalOptions{}.max_cells), reps);
  std::printf("%-18s %9s %7s %11s %6s %9s %11s %7s\n", "case", "time_s", "stride", "cells", "ckpts", "ns/cell",
              "baseline_s", "ratio");
  for (const Case& c : Cases()) {
    viper::Result<viper::Schedule> out = viper::OptimalSchedule(c.in);
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), out.status().ToString().c_str());
      return 1;
    }
    const double t = Best(reps, [&] { (void)viper::OptimalSchedule(c.in); });
    const double base = BaselineSeconds(out->dp_cells, reps);
    std::printf("%-18s %9.3f %7lld %11lld %6lld %9.1f %11.4f %7.1f\n", c.name.c_str(), t,
                static_cast<long long>(out->stride), static_cast<long long>(out->dp_cells),
                static_cast<long long>(out->checkpoints()), 1e9 * t / static_cast<double>(out->dp_cells), base,
                t / base);
  }
  return 0;
}
