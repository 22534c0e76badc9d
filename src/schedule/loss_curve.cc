// LossCurve: evaluation, derivative and printing of the fitted families.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "viper/loss_fit.h"

namespace viper {

std::string_view loss_family_name(LossFamily family) {
  switch (family) {
    case LossFamily::kExp: return "exp";
    case LossFamily::kExpOffset: return "exp+c";
    case LossFamily::kLinear: return "linear";
    case LossFamily::kPowerLaw: return "power";
    case LossFamily::kCustom: return "custom";
  }
  return "unknown";
}

int loss_family_parameter_count(LossFamily family) {
  switch (family) {
    case LossFamily::kExp:
    case LossFamily::kLinear: return 2;
    case LossFamily::kExpOffset:
    case LossFamily::kPowerLaw: return 3;
    case LossFamily::kCustom: return 0;
  }
  return 0;
}

LossCurve LossCurve::Exp(double a, double b) {
  LossCurve c;
  c.valid_ = true;
  c.family_ = LossFamily::kExp;
  c.p_[0] = a;
  c.p_[1] = b;
  return c;
}

LossCurve LossCurve::ExpOffset(double a, double b, double c0) {
  LossCurve c = Exp(a, b);
  c.family_ = LossFamily::kExpOffset;
  c.p_[2] = c0;
  return c;
}

LossCurve LossCurve::Linear(double a, double b) {
  LossCurve c = Exp(a, b);
  c.family_ = LossFamily::kLinear;
  return c;
}

LossCurve LossCurve::PowerLaw(double a, double alpha, double c0) {
  LossCurve c = ExpOffset(a, alpha, c0);
  c.family_ = LossFamily::kPowerLaw;
  return c;
}

LossCurve LossCurve::Custom(std::function<double(double)> value, std::function<double(double)> derivative,
                            std::string description) {
  LossCurve c;
  c.valid_ = static_cast<bool>(value);
  c.family_ = LossFamily::kCustom;
  c.value_fn_ = std::move(value);
  c.derivative_fn_ = std::move(derivative);
  c.description_ = std::move(description);
  return c;
}

LossCurve LossCurve::FlatAfter(double x) const {
  LossCurve c = *this;
  c.flat_after_ = std::isfinite(x) ? x : std::numeric_limits<double>::infinity();
  return c;
}

double LossCurve::value(double x) const { return RawValue(std::min(x, flat_after_)); }

double LossCurve::derivative(double x) const { return x > flat_after_ ? 0.0 : RawDerivative(x); }

double LossCurve::RawValue(double x) const {
  if (!valid_) return std::numeric_limits<double>::quiet_NaN();
  switch (family_) {
    case LossFamily::kExp: return p_[0] * std::exp(-p_[1] * x);
    case LossFamily::kExpOffset: return p_[0] * std::exp(-p_[1] * x) + p_[2];
    case LossFamily::kLinear: return p_[0] * x + p_[1];
    case LossFamily::kPowerLaw: return p_[2] + p_[0] * std::pow(x, -p_[1]);
    case LossFamily::kCustom: return value_fn_(x);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double LossCurve::RawDerivative(double x) const {
  if (!valid_) return std::numeric_limits<double>::quiet_NaN();
  switch (family_) {
    case LossFamily::kExp:
    case LossFamily::kExpOffset: return -p_[0] * p_[1] * std::exp(-p_[1] * x);
    case LossFamily::kLinear: return p_[0];
    case LossFamily::kPowerLaw: return -p_[1] * p_[0] * std::pow(x, -p_[1] - 1.0);
    case LossFamily::kCustom:
      if (derivative_fn_) return derivative_fn_(x);
      {
        // Central difference; the step keeps O(h^2) truncation well under rounding for smooth curves.
        const double h = 1e-3 * std::max(1.0, std::abs(x));
        return (value_fn_(x + h) - value_fn_(x - h)) / (2 * h);
      }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::vector<std::pair<std::string, double>> LossCurve::parameters() const {
  if (!valid_) return {};
  switch (family_) {
    case LossFamily::kExp: return {{"a", p_[0]}, {"b", p_[1]}};
    case LossFamily::kExpOffset: return {{"a", p_[0]}, {"b", p_[1]}, {"c", p_[2]}};
    case LossFamily::kLinear: return {{"a", p_[0]}, {"b", p_[1]}};
    case LossFamily::kPowerLaw: return {{"a", p_[0]}, {"alpha", p_[1]}, {"c", p_[2]}};
    case LossFamily::kCustom: return {};
  }
  return {};
}

std::string LossCurve::ToString() const {
  if (!valid_) return "(no curve)";
  if (std::isfinite(flat_after_)) return fmt::format("{} (flat after x = {:.0f})", FlatAfter(INFINITY).ToString(), flat_after_);
  switch (family_) {
    case LossFamily::kExp: return fmt::format("{:.10g}*exp(-{:.10g}*x)", p_[0], p_[1]);
    case LossFamily::kExpOffset: return fmt::format("{:.10g}*exp(-{:.10g}*x) + {:.10g}", p_[0], p_[1], p_[2]);
    case LossFamily::kLinear: return fmt::format("{:.10g}*x + {:.10g}", p_[0], p_[1]);
    case LossFamily::kPowerLaw: return fmt::format("{:.10g} + {:.10g}*x^(-{:.10g})", p_[2], p_[0], p_[1]);
    case LossFamily::kCustom: return description_;
  }
  return "(unknown)";
}

}  // namespace viper
