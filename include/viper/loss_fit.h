// Loss predictor of the Inference Performance Predictor (IPP; docs/ARCHITECTURE.md "Inference
// Performance Predictor").
//
// Fits (iteration, loss) samples of a training run with four families and keeps the one with the
// lowest mean squared error:
//
//   kExp        L(x) = a*exp(-b*x)            params {a, b}       guard b > 0
//   kExpOffset  L(x) = a*exp(-b*x) + c        params {a, b, c}    guard b > 0
//   kLinear     L(x) = a*x + b                params {a, b}       guard L > 0 up to the horizon
//   kPowerLaw   L(x) = c + a*x^(-alpha)       params {a, alpha, c} guard alpha > 0, uses x >= 1 only
//
// Nonlinear families are fitted by variable projection (a 1-D search over the decay parameter with
// closed-form linear least squares for the rest), then refined jointly by Levenberg-Marquardt.
// Noisy minibatch losses are smoothed first (centred moving average); noise-free data is left
// alone so that it is fitted back to its parameters to ~1e-9.
//
// Everything here is a pure function of its inputs: thread-safe, no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "viper/status.h"

namespace viper {

// One logged training step: the loss observed after `iteration`.
struct LossSample {
  int64_t iteration = 0;
  double loss = 0.0;
};

// Checks that samples are usable: non-empty, iterations >= 0 and strictly increasing, losses
// finite. The message names the first offending sample.
Status ValidateLossSamples(std::span<const LossSample> samples);

// Parses a loss log in CSV form: a header line `iteration,loss`, then one `<int>,<number>` row per
// line (blank lines and a trailing CR are tolerated). Rejects a missing header, non-numeric
// fields, extra columns, non-monotone iterations, NaN/inf and an empty log with
// InvalidArgument "<source>:<line>: <why>".
Result<std::vector<LossSample>> ParseLossLog(std::string_view csv_text, std::string_view source = "loss log");
// Reads and parses the file at `path` (IOError/NotFound if it cannot be read).
Result<std::vector<LossSample>> ReadLossLog(const std::string& path);

enum class LossFamily : uint8_t { kExp, kExpOffset, kLinear, kPowerLaw, kCustom };

// "exp", "exp+c", "linear", "power", "custom".
std::string_view loss_family_name(LossFamily family);
// Number of free parameters (2 or 3; 0 for kCustom).
int loss_family_parameter_count(LossFamily family);

// A predicted loss curve L(x): one of the fitted families, or a caller-supplied function.
// Value type, cheap to copy (a custom curve shares its functions). A default-constructed curve is
// empty: valid() is false and value() returns NaN.
class LossCurve {
 public:
  LossCurve() = default;
  static LossCurve Exp(double a, double b);
  static LossCurve ExpOffset(double a, double b, double c);
  static LossCurve Linear(double a, double b);
  static LossCurve PowerLaw(double a, double alpha, double c);
  // REQUIRES: value is set; derivative may be empty, then a central difference is used.
  static LossCurve Custom(std::function<double(double)> value, std::function<double(double)> derivative = {},
                          std::string description = "custom");

  bool valid() const { return valid_; }
  LossFamily family() const { return family_; }
  double value(double x) const;
  double derivative(double x) const;
  // Named parameters in the family's order, e.g. {{"a", 2}, {"b", 0.01}, {"c", 0.1}}.
  std::vector<std::pair<std::string, double>> parameters() const;
  // Human-readable formula with the parameters, e.g. "2*exp(-0.01*x) + 0.1" (plus
  // " (flat after x = N)" for a bounded curve).
  std::string ToString() const;

  // Bounded extrapolation: the same curve held constant after iteration `x` (value(y) = value(x)
  // and derivative 0 for y > x). A non-finite x removes the bound.
  LossCurve FlatAfter(double x) const;
  double flat_after() const { return flat_after_; }  // +inf when unbounded

 private:
  bool valid_ = false;
  LossFamily family_ = LossFamily::kCustom;
  double p_[3] = {0, 0, 0};
  double flat_after_ = std::numeric_limits<double>::infinity();
  double RawValue(double x) const;
  double RawDerivative(double x) const;
  std::function<double(double)> value_fn_;
  std::function<double(double)> derivative_fn_;
  std::string description_;
};

struct FitOptions {
  // Last iteration the curve will be used for (the IPP's `e`): a linear fit that reaches <= 0 at
  // or before it is rejected. 0 means the last sample's iteration.
  int64_t horizon = 0;
  // Centred moving-average window (odd). 0 = auto: smooth only if noise dominates the
  // step-to-step changes (median |second difference| > median |first difference|: ~1.7 for white
  // noise, < 1 for any clean exponential or power law), with window clamp(n/25, 5, 101) made odd.
  // 1 = never smooth.
  int smoothing_window = 0;
  // Parsimony (selection is "lowest MSE" otherwise): a family with fewer parameters is kept
  // unless the richer one lowers the MSE by more than parsimony_f * (extra parameters) /
  // (n_eff - its parameters), an F test with n_eff = samples / smoothing window. Without it
  // a*exp(-b*x)+c, which contains a*exp(-b*x) and approaches a line as b -> 0, would win on noise.
  double parsimony_f = 4.0;
  // Smoothed samples beyond this count are thinned evenly before fitting (keeps refits cheap).
  int max_points = 4000;
  // Robustness for fits that plan the future (the online Scheduler turns all three on; the
  // defaults keep the plain least-squares selection above):
  //
  // Fraction of the (smoothed) points, the last ones, held out to select the family by how well
  // it *extrapolates*: each family is fitted on the first (1 - holdout) of the points and scored
  // by its MSE on the held-out rest (the parsimony rule applies to these scores), then the chosen
  // family is refitted on all points. 0 = select by in-sample MSE. At most 0.5.
  double holdout = 0.0;
  // Reject a curve that rises anywhere on [first sample, horizon] (training loss does not grow;
  // a rising fit would make every new version look worse), and, when every sample is >= 0, a
  // curve that falls below 0 before the horizon. Samples beyond 3.5 robust standard deviations
  // (MAD) from their neighbourhood's median are also clipped before smoothing (one diverged
  // minibatch must not bend the curve).
  bool monotone = false;
  // Bounded extrapolation: the chosen curve is held flat after x_last + max_extrapolation *
  // (x_last - x_first) (LossCurve::FlatAfter): improvements further ahead than that are not
  // predicted until later samples show them. 0 = unbounded.
  double max_extrapolation = 0.0;
  // Families tried (kCustom is ignored).
  std::vector<LossFamily> families = {LossFamily::kExp, LossFamily::kExpOffset, LossFamily::kLinear,
                                      LossFamily::kPowerLaw};
};

// What the online Scheduler fits with: holdout 0.25, monotone, max_extrapolation 2 (predict at
// most twice as far ahead as the samples reach back; measured in loss_fit_test
// RobustOptionsExtrapolateNoWorseOnNoisyWarmups and docs/ARCHITECTURE.md).
FitOptions RobustFitOptions();

// The outcome for one family: a curve and its MSE, or why it was rejected.
struct FamilyFit {
  LossFamily family = LossFamily::kCustom;
  bool accepted = false;
  LossCurve curve;             // set when accepted
  double mse = 0.0;            // mean squared error on the (smoothed) points it was fitted to
  int64_t points = 0;          // number of points fitted
  std::string rejected_reason; // set when !accepted
  // FitOptions::holdout > 0: MSE on the held-out last points of the same family fitted without
  // them (what the selection compares); NaN when not computed or that fit was rejected.
  double holdout_mse = std::numeric_limits<double>::quiet_NaN();
};

struct LossFit {
  LossCurve curve;   // the chosen family's curve
  double mse = 0.0;  // its MSE
  int smoothing_window = 1;             // window actually used (1 = none)
  std::vector<FamilyFit> candidates;    // every family tried, in FitOptions::families order
};

// Centred moving average with a window shrinking symmetrically at the ends (so that a linear
// trend is preserved exactly). REQUIRES: window >= 1 and odd.
std::vector<double> SmoothLosses(std::span<const LossSample> samples, int window);

// Fits one family to `samples` as given (no smoothing). Returns InvalidArgument when the samples
// are invalid or too few (fewer than the family's parameter count + 1 usable points); a fit that
// fails a guard is returned with accepted = false and the reason.
Result<FamilyFit> FitLossFamily(LossFamily family, std::span<const LossSample> samples, int64_t horizon = 0);

// Smooths (per options), fits every family and selects by MSE with the parsimony rule above.
// InvalidArgument if the samples are invalid or no family is accepted (all reasons listed).
Result<LossFit> FitLossCurve(std::span<const LossSample> samples, const FitOptions& options = {});

}  // namespace viper
