// Least-squares fits of the loss families, smoothing, and the selection by MSE.
//
// Nonlinear families (exp, exp+c, power) are separable: for a fixed decay parameter theta the
// model is linear in the rest. Variable projection minimises SSE(theta) (closed-form linear least
// squares inside) over a log-spaced grid of theta, refines the best bracket by golden section, and
// Levenberg-Marquardt then polishes all parameters jointly. Coordinates are scaled (u = (x - x0)/X
// for exp, x/x_max for power) so that the normal equations stay well conditioned.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "viper/loss_fit.h"

namespace viper {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Points {
  std::vector<double> x;
  std::vector<double> y;
  size_t size() const { return x.size(); }
};

// ---- small dense linear algebra ----------------------------------------------------------------

// Solves the n x n system A p = g (n <= 3) by Gaussian elimination with partial pivoting.
// Returns false if A is singular to working precision.
template <size_t N>
bool SolveSmall(std::array<std::array<long double, N>, N> a, std::array<long double, N> g, size_t n,
                std::array<long double, N>* out) {
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (a[pivot][col] == 0) return false;
    std::swap(a[pivot], a[col]);
    std::swap(g[pivot], g[col]);
    for (size_t r = col + 1; r < n; ++r) {
      const long double f = a[r][col] / a[col][col];
      for (size_t c = col; c < n; ++c) a[r][c] -= f * a[col][c];
      g[r] -= f * g[col];
    }
  }
  for (size_t i = n; i-- > 0;) {
    long double s = g[i];
    for (size_t c = i + 1; c < n; ++c) s -= a[i][c] * (*out)[c];
    (*out)[i] = s / a[i][i];
  }
  return true;
}

// ---- the separable model: y ~ A*phi(u; theta) [+ C] ------------------------------------------

// phi_i(theta) = exp(-theta * b_i): b = u for the exponential, b = log(u) for the power law
// (u^-theta), so both families share one code path and the power law costs an exp, not a pow.
struct Separable {
  bool offset;            // has the constant C
  std::vector<double> b;  // exponent abscissae
  const std::vector<double>* y;
};

struct LinearPart {
  double a = 0, c = 0, sse = kInf;
};

// For a fixed theta, the closed-form least-squares A (and C) and the resulting SSE. The SSE comes
// from the sums (sum y^2 - A*sum(phi*y) - C*sum(y)): cheap, and accurate to ~1e-19 of sum y^2,
// enough to locate theta; Levenberg-Marquardt then works on the exact residuals.
LinearPart SolveLinear(const Separable& m, double theta) {
  long double spp = 0, sp = 0, spy = 0, sy = 0, syy = 0;
  const size_t n = m.b.size();
  for (size_t i = 0; i < n; ++i) {
    const long double p = std::exp(-theta * m.b[i]), y = (*m.y)[i];
    spp += p * p, sp += p, spy += p * y, sy += y, syy += y * y;
  }
  LinearPart r;
  long double a = 0, c = 0;
  if (m.offset) {
    const long double det = spp * n - sp * sp;
    if (!(std::fabs(det) > 1e-300L * spp * n)) return r;
    a = (spy * n - sp * sy) / det;
    c = (spp * sy - sp * spy) / det;
  } else {
    if (!(spp > 0)) return r;
    a = spy / spp;
  }
  const double sse = static_cast<double>(std::max(0.0L, syy - a * spy - c * sy));
  r.a = static_cast<double>(a), r.c = static_cast<double>(c);
  r.sse = std::isfinite(sse) && std::isfinite(r.a) && std::isfinite(r.c) ? sse : kInf;
  return r;
}

double SseAt(const Separable& m, double log_theta) { return SolveLinear(m, std::exp(log_theta)).sse; }

// Golden-section minimum of SSE over log(theta) in [lo, hi].
double GoldenSection(const Separable& m, double lo, double hi) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
  double f1 = SseAt(m, x1), f2 = SseAt(m, x2);
  for (int i = 0; i < 100 && hi - lo > 1e-10; ++i) {
    if (f1 <= f2) {
      hi = x2, x2 = x1, f2 = f1;
      x1 = hi - g * (hi - lo), f1 = SseAt(m, x1);
    } else {
      lo = x1, x1 = x2, f1 = f2;
      x2 = lo + g * (hi - lo), f2 = SseAt(m, x2);
    }
  }
  return (lo + hi) / 2;
}

// Variable projection: the theta in [theta_lo, theta_hi] (log grid) minimising SSE.
double SearchTheta(const Separable& m, double theta_lo, double theta_hi) {
  constexpr int kGrid = 121;
  const double l0 = std::log(theta_lo), l1 = std::log(theta_hi), step = (l1 - l0) / (kGrid - 1);
  int best = 0;
  double best_sse = kInf;
  for (int i = 0; i < kGrid; ++i) {
    const double sse = SseAt(m, l0 + i * step);
    if (sse < best_sse) best_sse = sse, best = i;
  }
  const double lo = l0 + std::max(0, best - 1) * step, hi = l0 + std::min(kGrid - 1, best + 1) * step;
  return std::exp(GoldenSection(m, lo, hi));
}

// Levenberg-Marquardt on (A, theta[, C]) starting from the variable-projection solution.
struct SepParams {
  double a, theta, c, sse;
};

double Sse(const Separable& m, const SepParams& p) {
  long double sse = 0;
  for (size_t i = 0; i < m.b.size(); ++i) {
    const long double e = p.a * std::exp(-p.theta * m.b[i]) + p.c - (*m.y)[i];
    sse += e * e;
  }
  return std::isfinite(static_cast<double>(sse)) ? static_cast<double>(sse) : kInf;
}

// The Gauss-Newton normal equations J^T J and -J^T r at p.
struct Normal {
  std::array<std::array<long double, 3>, 3> jtj{};
  std::array<long double, 3> g{};
};

Normal NormalAt(const Separable& m, const SepParams& p) {
  Normal ne;
  const size_t np = m.offset ? 3 : 2;
  for (size_t i = 0; i < m.b.size(); ++i) {
    const long double phi = std::exp(-p.theta * m.b[i]);
    const long double j[3] = {phi, -p.a * m.b[i] * phi, 1.0L};
    const long double r = p.a * phi + p.c - (*m.y)[i];
    for (size_t a = 0; a < np; ++a) {
      ne.g[a] -= j[a] * r;
      for (size_t b = 0; b < np; ++b) ne.jtj[a][b] += j[a] * j[b];
    }
  }
  return ne;
}

SepParams Refine(const Separable& m, SepParams p) {
  const size_t np = m.offset ? 3 : 2;
  double lambda = 1e-6;
  Normal ne = NormalAt(m, p);
  for (int iter = 0; iter < 100 && lambda < 1e10; ++iter) {
    Normal damped = ne;
    for (size_t a = 0; a < np; ++a) damped.jtj[a][a] *= (1.0L + lambda);
    std::array<long double, 3> d{};
    if (!SolveSmall<3>(damped.jtj, damped.g, np, &d)) break;
    SepParams trial{static_cast<double>(p.a + d[0]), static_cast<double>(p.theta + d[1]),
                    m.offset ? static_cast<double>(p.c + d[2]) : 0.0, 0.0};
    trial.sse = Sse(m, trial);
    if (!(trial.sse < p.sse)) {
      lambda *= 10;
      continue;
    }
    const bool converged = p.sse - trial.sse <= 1e-14 * p.sse;
    p = trial;
    if (converged) break;
    lambda = std::max(lambda / 10, 1e-12);
    ne = NormalAt(m, p);
  }
  return p;
}

SepParams FitSeparable(const Separable& m, double theta_lo, double theta_hi) {
  const double theta = SearchTheta(m, theta_lo, theta_hi);
  const LinearPart lin = SolveLinear(m, theta);
  return Refine(m, {lin.a, theta, lin.c, lin.sse});
}

// ---- families ----------------------------------------------------------------------------------

Points ToPoints(std::span<const LossSample> samples, bool positive_x_only) {
  Points p;
  for (const LossSample& s : samples) {
    if (positive_x_only && s.iteration < 1) continue;
    p.x.push_back(static_cast<double>(s.iteration));
    p.y.push_back(s.loss);
  }
  return p;
}

FamilyFit Rejected(LossFamily family, size_t n, std::string why) {
  FamilyFit f;
  f.family = family;
  f.points = static_cast<int64_t>(n);
  f.rejected_reason = std::move(why);
  return f;
}

FamilyFit Accepted(LossFamily family, size_t n, LossCurve curve, double sse) {
  FamilyFit f;
  f.family = family;
  f.accepted = true;
  f.points = static_cast<int64_t>(n);
  f.curve = std::move(curve);
  f.mse = sse / static_cast<double>(n);
  return f;
}

FamilyFit FitLinear(const Points& p, int64_t horizon) {
  const size_t n = p.size();
  long double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += p.x[i], my += p.y[i];
  mx /= n, my /= n;
  long double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) sxx += (p.x[i] - mx) * (p.x[i] - mx), sxy += (p.x[i] - mx) * (p.y[i] - my);
  const double a = static_cast<double>(sxy / sxx), b = static_cast<double>(my - sxy / sxx * mx);
  const LossCurve curve = LossCurve::Linear(a, b);
  // A line is monotone: non-positive somewhere in [x_first, horizon] iff at one of the ends.
  for (double x : {p.x.front(), static_cast<double>(std::max<int64_t>(horizon, static_cast<int64_t>(p.x.back())))}) {
    if (!(curve.value(x) > 0)) {
      return Rejected(LossFamily::kLinear, n,
                      fmt::format("{} reaches {:.6g} <= 0 at iteration {:.0f}, before the end", curve.ToString(),
                                  curve.value(x), x));
    }
  }
  long double sse = 0;
  for (size_t i = 0; i < n; ++i) sse += (curve.value(p.x[i]) - p.y[i]) * (curve.value(p.x[i]) - p.y[i]);
  return Accepted(LossFamily::kLinear, n, curve, static_cast<double>(sse));
}

// a*exp(-b*x) [+ c], fitted as A*exp(-B*u) [+ C] with u = (x - x0)/X.
FamilyFit FitExp(LossFamily family, const Points& p) {
  const double x0 = p.x.front(), span = std::max(1.0, p.x.back() - p.x.front());
  Separable m{family == LossFamily::kExpOffset, {}, &p.y};
  for (double x : p.x) m.b.push_back((x - x0) / span);
  const SepParams s = FitSeparable(m, 1e-4, 2e3);
  const double b = s.theta / span, a = s.a * std::exp(b * x0);
  if (!(s.theta > 0) || !std::isfinite(b)) {
    return Rejected(family, p.size(), fmt::format("decay rate b = {:.6g} is not positive", b));
  }
  if (!std::isfinite(a) || !std::isfinite(s.sse)) {
    return Rejected(family, p.size(), fmt::format("no finite fit (a = {:.6g}, b = {:.6g})", a, b));
  }
  LossCurve curve = m.offset ? LossCurve::ExpOffset(a, b, s.c) : LossCurve::Exp(a, b);
  return Accepted(family, p.size(), std::move(curve), s.sse);
}

// c + a*x^(-alpha), fitted as C + A*(x/x_max)^(-alpha) on x >= 1.
FamilyFit FitPower(const Points& p) {
  const double scale = p.x.back();
  Separable m{true, {}, &p.y};
  for (double x : p.x) m.b.push_back(std::log(x / scale));
  const SepParams s = FitSeparable(m, 1e-4, 20.0);
  const double a = s.a * std::pow(scale, s.theta);
  if (!(s.theta > 0)) {
    return Rejected(LossFamily::kPowerLaw, p.size(), fmt::format("exponent alpha = {:.6g} is not positive", s.theta));
  }
  if (!std::isfinite(a) || !std::isfinite(s.sse)) {
    return Rejected(LossFamily::kPowerLaw, p.size(), fmt::format("no finite fit (a = {:.6g})", a));
  }
  return Accepted(LossFamily::kPowerLaw, p.size(), LossCurve::PowerLaw(a, s.theta, s.c), s.sse);
}

// ---- smoothing and selection -------------------------------------------------------------------

double MedianAbs(std::vector<double> v) {
  for (double& d : v) d = std::abs(d);
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Noise dominates the step-to-step changes when the median |second difference| exceeds the
// median |first difference|: ~1.73 for white noise, 1 - exp(-b*dx) < 1 for a clean exponential,
// ~(alpha+1)*dx/x for a clean power law.
bool LooksNoisy(std::span<const LossSample> samples) {
  if (samples.size() < 5) return false;
  std::vector<double> d1, d2;
  for (size_t i = 1; i < samples.size(); ++i) d1.push_back(samples[i].loss - samples[i - 1].loss);
  for (size_t i = 1; i < d1.size(); ++i) d2.push_back(d1[i] - d1[i - 1]);
  return MedianAbs(d2) > MedianAbs(d1);
}

int ChooseWindow(std::span<const LossSample> samples, int requested) {
  if (requested >= 1) return requested;
  if (!LooksNoisy(samples)) return 1;
  int w = std::clamp(static_cast<int>(samples.size() / 25), 5, 101);
  return w | 1;
}

std::vector<LossSample> Thin(std::vector<LossSample> samples, int max_points) {
  if (max_points < 2 || samples.size() <= static_cast<size_t>(max_points)) return samples;
  std::vector<LossSample> out;
  const double step = static_cast<double>(samples.size() - 1) / (max_points - 1);
  for (int i = 0; i < max_points; ++i) out.push_back(samples[static_cast<size_t>(std::llround(i * step))]);
  return out;
}

// Lowest score (the MSE, or the held-out MSE), except that a family with fewer parameters wins
// unless the richer one lowers the score significantly: by more than F * (extra parameters) /
// (n_eff - its parameters), an F test with n_eff = independent points (points / smoothing window:
// smoothed residuals are correlated).
int SelectFamily(const std::vector<FamilyFit>& fits, const std::vector<double>& score, double f_ratio, double n_eff,
                 double y_scale2) {
  int best = -1;
  for (size_t i = 0; i < fits.size(); ++i) {
    if (fits[i].accepted && (best < 0 || score[i] < score[best])) best = static_cast<int>(i);
  }
  if (best < 0) return best;
  const int p_best = loss_family_parameter_count(fits[best].family);
  int chosen = best;
  for (size_t i = 0; i < fits.size(); ++i) {
    const int p = loss_family_parameter_count(fits[i].family);
    if (!fits[i].accepted || p >= p_best) continue;
    const double tolerance = f_ratio * (p_best - p) / std::max(1.0, n_eff - p_best);
    // The absolute floor keeps exact (noise-free) fits comparable at rounding level.
    if (score[i] > score[best] * (1 + tolerance) + 1e-24 * y_scale2) continue;
    const int pc = loss_family_parameter_count(fits[chosen].family);
    if (p < pc || (p == pc && score[i] < score[chosen])) chosen = static_cast<int>(i);
  }
  return chosen;
}

// FitOptions::monotone: why `curve` cannot be a training-loss curve on [from, horizon] ("" if it
// can). Every family is monotone, so rising is a sign of its slope and the minimum is at an end.
std::string MonotoneViolation(const LossCurve& curve, double from, double horizon, bool nonnegative) {
  const double slope = curve.derivative(from);
  if (slope > 0) return fmt::format("{} rises (slope {:.6g} at iteration {:.0f})", curve.ToString(), slope, from);
  const double low = curve.value(std::max(from, horizon));
  if (nonnegative && low < 0) {
    return fmt::format("{} falls to {:.6g} < 0 by iteration {:.0f} (every observed loss is >= 0)", curve.ToString(),
                       low, std::max(from, horizon));
  }
  return "";
}

// FitOptions::monotone: clips each loss to median +- 3.5 robust standard deviations (1.4826 *
// MAD) of the `window` samples around it. Clean curves are untouched (their residual from the
// local median is far smaller than any spike).
void ClipOutliers(std::vector<LossSample>& samples, int window) {
  const int64_t n = static_cast<int64_t>(samples.size()), half = std::max(2, window / 2);
  if (n < 5) return;
  std::vector<double> clipped(n);
  std::vector<double> local;
  for (int64_t i = 0; i < n; ++i) {
    local.clear();
    for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(n - 1, i + half); ++j) local.push_back(samples[j].loss);
    std::nth_element(local.begin(), local.begin() + local.size() / 2, local.end());
    const double median = local[local.size() / 2];
    for (double& v : local) v -= median;
    const double limit = 3.5 * 1.4826 * MedianAbs(local);
    clipped[i] = limit > 0 ? std::clamp(samples[i].loss, median - limit, median + limit) : samples[i].loss;
  }
  for (int64_t i = 0; i < n; ++i) samples[i].loss = clipped[i];
}

// One family on `points` with the guards of `options`.
FamilyFit FitGuarded(LossFamily family, std::span<const LossSample> points, const FitOptions& options,
                     bool nonnegative) {
  Result<FamilyFit> one = FitLossFamily(family, points, options.horizon);
  FamilyFit f = one.ok() ? std::move(one).value() : Rejected(family, 0, one.status().message());
  if (f.accepted && options.monotone) {
    const double from = static_cast<double>(points.front().iteration);
    const double horizon = static_cast<double>(std::max(options.horizon, points.back().iteration));
    std::string why = MonotoneViolation(f.curve, from, horizon, nonnegative);
    if (!why.empty()) f = Rejected(family, f.points, std::move(why));
  }
  return f;
}

// MSE of `curve` on `points`.
double MseOn(const LossCurve& curve, std::span<const LossSample> points) {
  long double sse = 0;
  for (const LossSample& s : points) {
    const long double e = curve.value(static_cast<double>(s.iteration)) - s.loss;
    sse += e * e;
  }
  const double mse = static_cast<double>(sse / static_cast<long double>(points.size()));
  return std::isfinite(mse) ? mse : kInf;
}

}  // namespace

std::vector<double> SmoothLosses(std::span<const LossSample> samples, int window) {
  const int64_t n = static_cast<int64_t>(samples.size());
  const int64_t half = std::max(0, window / 2);
  std::vector<long double> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + samples[i].loss;
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t h = std::min({half, i, n - 1 - i});  // symmetric: keeps linear trends exact
    out[i] = static_cast<double>((prefix[i + h + 1] - prefix[i - h]) / (2 * h + 1));
  }
  return out;
}

Result<FamilyFit> FitLossFamily(LossFamily family, std::span<const LossSample> samples, int64_t horizon) {
  VIPER_RETURN_IF_ERROR(ValidateLossSamples(samples));
  const bool power = family == LossFamily::kPowerLaw;
  const Points p = ToPoints(samples, power);
  const size_t need = static_cast<size_t>(loss_family_parameter_count(family)) + 1;
  if (family == LossFamily::kCustom) return Status::InvalidArgument("cannot fit the custom family");
  if (p.size() < need) {
    return Status::InvalidArgument(fmt::format("fit of {}: {} usable samples{}, need at least {}",
                                               loss_family_name(family), p.size(),
                                               power ? " with iteration >= 1" : "", need));
  }
  switch (family) {
    case LossFamily::kLinear: return FitLinear(p, horizon);
    case LossFamily::kExp:
    case LossFamily::kExpOffset: return FitExp(family, p);
    case LossFamily::kPowerLaw: return FitPower(p);
    case LossFamily::kCustom: break;
  }
  return Status::Internal("unreachable family");
}

FitOptions RobustFitOptions() {
  FitOptions o;
  o.holdout = 0.25;
  o.monotone = true;
  o.max_extrapolation = 2.0;
  return o;
}

Result<LossFit> FitLossCurve(std::span<const LossSample> samples, const FitOptions& options) {
  VIPER_RETURN_IF_ERROR(ValidateLossSamples(samples));
  if (options.smoothing_window < 0 || (options.smoothing_window > 1 && options.smoothing_window % 2 == 0)) {
    return Status::InvalidArgument(
        fmt::format("fit: smoothing_window {} must be 0 (auto), 1 (none) or odd", options.smoothing_window));
  }
  if (!(options.holdout >= 0 && options.holdout <= 0.5) || !(options.max_extrapolation >= 0)) {
    return Status::InvalidArgument(fmt::format("fit: holdout {} must be in [0, 0.5] and max_extrapolation {} >= 0",
                                               options.holdout, options.max_extrapolation));
  }
  LossFit fit;
  fit.smoothing_window = ChooseWindow(samples, options.smoothing_window);
  std::vector<LossSample> smoothed(samples.begin(), samples.end());
  if (options.monotone) ClipOutliers(smoothed, std::max(fit.smoothing_window, 9));
  const std::vector<double> ys = SmoothLosses(smoothed, fit.smoothing_window);
  for (size_t i = 0; i < smoothed.size(); ++i) smoothed[i].loss = ys[i];
  smoothed = Thin(std::move(smoothed), options.max_points);
  double y_scale2 = 0;
  bool nonnegative = true;
  for (const LossSample& s : samples) nonnegative = nonnegative && s.loss >= 0;
  for (const LossSample& s : smoothed) y_scale2 = std::max(y_scale2, s.loss * s.loss);

  // Held-out points: the last `holdout` of them, if the rest still has room for 3-parameter fits.
  const size_t held = static_cast<size_t>(options.holdout * static_cast<double>(smoothed.size()));
  const bool use_holdout = held >= 2 && smoothed.size() - held >= 8;
  const std::span<const LossSample> all(smoothed), head = all.first(smoothed.size() - held), tail = all.last(held);

  std::string reasons;
  std::vector<double> score;
  for (LossFamily family : options.families) {
    if (family == LossFamily::kCustom) continue;
    FamilyFit f = FitGuarded(family, all, options, nonnegative);
    if (f.accepted && use_holdout) {
      const FamilyFit early = FitGuarded(family, head, options, nonnegative);
      if (early.accepted) f.holdout_mse = MseOn(early.curve, tail);
    }
    if (!f.accepted) reasons += fmt::format("; {}: {}", loss_family_name(family), f.rejected_reason);
    score.push_back(use_holdout ? (std::isnan(f.holdout_mse) ? kInf : f.holdout_mse) : f.mse);
    fit.candidates.push_back(std::move(f));
  }
  // The held-out scores decide unless no early fit was accepted; n_eff counts the points scored.
  const bool held_scores = use_holdout && std::any_of(score.begin(), score.end(), [](double v) { return v < kInf; });
  if (use_holdout && !held_scores) {
    for (size_t i = 0; i < score.size(); ++i) score[i] = fit.candidates[i].mse;
  }
  const double scored = held_scores ? static_cast<double>(held) / static_cast<double>(smoothed.size()) : 1.0;
  const double n_eff = std::min(scored * static_cast<double>(smoothed.size()),
                                scored * static_cast<double>(samples.size()) / fit.smoothing_window);
  const int chosen = SelectFamily(fit.candidates, score, options.parsimony_f, std::max(1.0, n_eff), y_scale2);
  if (chosen < 0) {
    return Status::InvalidArgument(fmt::format("fit: no loss family fits the {} samples{}", samples.size(), reasons));
  }
  fit.curve = fit.candidates[chosen].curve;
  fit.mse = fit.candidates[chosen].mse;
  if (options.max_extrapolation > 0) {
    const double first = static_cast<double>(samples.front().iteration), last = static_cast<double>(samples.back().iteration);
    fit.curve = fit.curve.FlatAfter(last + options.max_extrapolation * std::max(1.0, last - first));
  }
  return fit;
}

}  // namespace viper
