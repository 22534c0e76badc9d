// The loss predictor: exact recovery of noise-free curves, family selection on noisy data,
// guards, smoothing, and the loss-log reader.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "viper/loss_fit.h"

namespace viper {
namespace {

std::vector<LossSample> Sample(const LossCurve& curve, int64_t from, int64_t to, int64_t step = 1,
                               double noise = 0.0, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<LossSample> out;
  for (int64_t x = from; x <= to; x += step) {
    out.push_back({x, curve.value(static_cast<double>(x)) + (noise > 0 ? noise * gauss(rng) : 0.0)});
  }
  return out;
}

void ExpectParams(const LossCurve& got, const LossCurve& want, double rel) {
  ASSERT_EQ(got.family(), want.family()) << got.ToString();
  const auto g = got.parameters(), w = want.parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].first, w[i].first);
    EXPECT_LT(std::abs(g[i].second - w[i].second), rel * std::abs(w[i].second))
        << g[i].first << ": got " << g[i].second << " want " << w[i].second << " (" << got.ToString() << ")";
  }
}

struct Truth {
  const char* name;
  LossCurve curve;
  int64_t from, to, step;
};

std::vector<Truth> NoiseFreeCases() {
  return {
      {"exp", LossCurve::Exp(2.0, 0.01), 0, 300, 1},
      {"exp steep", LossCurve::Exp(5.0, 0.2), 0, 60, 1},
      {"exp late warm-up", LossCurve::Exp(1.5, 2e-4), 5000, 15000, 10},
      {"exp+c worked example", LossCurve::ExpOffset(2.0, 0.01, 0.1), 0, 100, 1},
      {"exp+c", LossCurve::ExpOffset(3.0, 0.002, 0.35), 0, 2000, 5},
      {"exp+c rising", LossCurve::ExpOffset(-0.5, 0.05, 1.0), 0, 100, 1},
      {"linear", LossCurve::Linear(-0.001, 2.0), 0, 500, 1},
      {"linear offset", LossCurve::Linear(-2e-5, 0.9), 1000, 9000, 20},
      {"power", LossCurve::PowerLaw(3.0, 0.5, 0.2), 1, 1000, 1},
      {"power steep", LossCurve::PowerLaw(20.0, 1.3, 0.05), 5, 3000, 5},
      {"power shallow", LossCurve::PowerLaw(2.0, 0.15, 0.4), 1, 20000, 20},
  };
}

TEST(LossFit, NoiseFreeDataIsFittedBackToItsParameters) {
  for (const Truth& t : NoiseFreeCases()) {
    SCOPED_TRACE(t.name);
    const std::vector<LossSample> samples = Sample(t.curve, t.from, t.to, t.step);
    Result<FamilyFit> fit = FitLossFamily(t.curve.family(), samples, t.to * 2);
    ASSERT_TRUE(fit.ok()) << fit.status().ToString();
    ASSERT_TRUE(fit->accepted) << fit->rejected_reason;
    ExpectParams(fit->curve, t.curve, 1e-6);
    EXPECT_LT(fit->mse, 1e-20);
  }
}

TEST(LossFit, NoiseFreeDataSelectsItsFamily) {
  for (const Truth& t : NoiseFreeCases()) {
    SCOPED_TRACE(t.name);
    FitOptions options;
    options.horizon = t.to * 2;
    Result<LossFit> fit = FitLossCurve(Sample(t.curve, t.from, t.to, t.step), options);
    ASSERT_TRUE(fit.ok()) << fit.status().ToString();
    EXPECT_EQ(fit->smoothing_window, 1) << "clean data must not be smoothed";
    ExpectParams(fit->curve, t.curve, 1e-6);
    EXPECT_EQ(fit->candidates.size(), 4u);
  }
}

// Minibatch-like noise (Gaussian, 3% of the loss range per step) on 1000 logged iterations.
TEST(LossFit, NoisyDataSelectsTheRightFamily) {
  const std::vector<Truth> cases = {
      {"exp", LossCurve::Exp(2.0, 0.003), 0, 999, 1},
      {"exp+c", LossCurve::ExpOffset(2.0, 0.005, 0.5), 0, 999, 1},
      {"linear", LossCurve::Linear(-0.0008, 2.0), 0, 999, 1},
      {"power", LossCurve::PowerLaw(3.0, 0.6, 0.1), 1, 1000, 1},
  };
  for (const Truth& t : cases) {
    const double range = std::abs(t.curve.value(t.from) - t.curve.value(t.to));
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE(std::string(t.name) + " seed " + std::to_string(seed));
      FitOptions options;
      options.horizon = 2000;
      Result<LossFit> fit = FitLossCurve(Sample(t.curve, t.from, t.to, t.step, 0.03 * range, seed), options);
      ASSERT_TRUE(fit.ok()) << fit.status().ToString();
      EXPECT_GT(fit->smoothing_window, 1) << "noisy data must be smoothed";
      std::string all;
      for (const FamilyFit& f : fit->candidates) {
        all += std::string(loss_family_name(f.family)) + " mse " + std::to_string(f.mse) + " " +
               (f.accepted ? f.curve.ToString() : f.rejected_reason) + "; ";
      }
      EXPECT_EQ(fit->curve.family(), t.curve.family()) << all;
      if (seed == 1) {
        std::printf("noisy %-7s -> %-7s %s  mse %.3g  window %d\n", t.name,
                    std::string(loss_family_name(fit->curve.family())).c_str(), fit->curve.ToString().c_str(),
                    fit->mse, fit->smoothing_window);
      }
    }
  }
}

TEST(LossFit, LinearFitThatReachesZeroBeforeTheEndIsRejected) {
  const std::vector<LossSample> samples = Sample(LossCurve::Linear(-0.001, 1.0), 0, 500);  // 0 at 1000
  Result<FamilyFit> early = FitLossFamily(LossFamily::kLinear, samples, 900);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(early->accepted);
  Result<FamilyFit> late = FitLossFamily(LossFamily::kLinear, samples, 1000);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->accepted);
  EXPECT_NE(late->rejected_reason.find("<= 0"), std::string::npos) << late->rejected_reason;
  // The selection then falls back to another family and lists the rejection.
  FitOptions options;
  options.horizon = 5000;
  options.families = {LossFamily::kLinear};
  Result<LossFit> only_linear = FitLossCurve(samples, options);
  ASSERT_FALSE(only_linear.ok());
  EXPECT_NE(only_linear.status().message().find("linear:"), std::string::npos) << only_linear.status().message();
}

TEST(LossFit, DecayRatesArePositive) {
  // Growing data: no positive decay rate explains it well, but any accepted fit keeps b > 0.
  const std::vector<LossSample> rising = Sample(LossCurve::Custom([](double x) { return std::exp(0.01 * x); }), 0, 200);
  for (LossFamily family : {LossFamily::kExp, LossFamily::kExpOffset, LossFamily::kPowerLaw}) {
    Result<FamilyFit> fit = FitLossFamily(family, rising);
    ASSERT_TRUE(fit.ok());
    if (fit->accepted) {
      EXPECT_GT(fit->curve.parameters()[1].second, 0) << fit->curve.ToString();
    } else {
      EXPECT_NE(fit->rejected_reason.find("not positive"), std::string::npos) << fit->rejected_reason;
    }
  }
}

TEST(LossFit, PowerLawUsesIterationsFromOne) {
  const LossCurve truth = LossCurve::PowerLaw(3.0, 0.5, 0.2);
  std::vector<LossSample> samples = Sample(truth, 1, 400);
  samples.insert(samples.begin(), LossSample{0, 10.0});  // iteration 0: no power-law value
  Result<FamilyFit> fit = FitLossFamily(LossFamily::kPowerLaw, samples);
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->points, 400);
  ExpectParams(fit->curve, truth, 1e-6);
}

TEST(LossFit, SmoothingKeepsLinesAndAveragesNoise) {
  const std::vector<LossSample> line = Sample(LossCurve::Linear(-0.01, 5.0), 0, 99);
  const std::vector<double> smooth = SmoothLosses(line, 11);
  for (size_t i = 0; i < line.size(); ++i) EXPECT_NEAR(smooth[i], line[i].loss, 1e-12);
  const std::vector<LossSample> noisy = Sample(LossCurve::Linear(0, 1.0), 0, 9999, 1, 0.1, 3);
  const std::vector<double> avg = SmoothLosses(noisy, 101);
  double var = 0;
  for (size_t i = 100; i + 100 < avg.size(); ++i) var += (avg[i] - 1.0) * (avg[i] - 1.0);
  var /= static_cast<double>(avg.size() - 200);
  EXPECT_LT(std::sqrt(var), 0.1 / std::sqrt(101.0) * 1.3);  // sigma / sqrt(w)
}

// The robust options (what the online Scheduler uses) on noisy warm-ups of several curves: the
// family chosen by held-out extrapolation error, outliers clipped, extrapolation bounded. Scored
// by the mean relative error of the predicted loss summed over the 4x longer run that follows the
// warm-up (what a CIL prediction needs), over 10 seeds per curve.
TEST(LossFit, RobustOptionsExtrapolateNoWorseOnNoisyWarmups) {
  const std::vector<Truth> cases = {
      {"exp+c", LossCurve::ExpOffset(2.0, 0.01, 0.3), 0, 150, 1},
      {"power", LossCurve::PowerLaw(3.0, 0.5, 0.2), 1, 150, 1},
      {"power shallow", LossCurve::PowerLaw(2.0, 0.2, 0.1), 1, 150, 1},
      {"exp", LossCurve::Exp(2.0, 0.004), 0, 150, 1},
  };
  double plain_total = 0, robust_total = 0;
  for (const Truth& t : cases) {
    double plain_err = 0, robust_err = 0;
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      std::vector<LossSample> warmup = Sample(t.curve, t.from, t.to, 1, 0.1 * t.curve.value(t.to), seed);
      warmup[40].loss *= 8;  // one diverged minibatch
      const int64_t end = 5 * t.to;
      FitOptions plain;
      plain.horizon = end;
      FitOptions robust = RobustFitOptions();
      robust.horizon = end;
      Result<LossFit> a = FitLossCurve(warmup, plain), b = FitLossCurve(warmup, robust);
      ASSERT_TRUE(a.ok() && b.ok()) << t.name;
      double truth = 0, pa = 0, pb = 0;
      for (int64_t x = t.to; x <= end; ++x) {
        truth += t.curve.value(x), pa += a->curve.value(x), pb += b->curve.value(x);
      }
      plain_err += std::abs(pa / truth - 1) / 10, robust_err += std::abs(pb / truth - 1) / 10;
    }
    std::printf("noisy warm-up %-13s -> predicted sum over the next 4x: plain %.1f%% off, robust %.1f%% off\n", t.name,
                100 * plain_err, 100 * robust_err);
    plain_total += plain_err, robust_total += robust_err;
  }
  EXPECT_LE(robust_total, plain_total);
}

TEST(LossFit, MonotoneRejectsRisingAndNegativeCurves) {
  FitOptions o;
  o.monotone = true;
  o.horizon = 400;
  const std::vector<LossSample> rising = Sample(LossCurve::Linear(0.002, 1.0), 0, 200);
  Result<LossFit> fit = FitLossCurve(rising, o);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("rises"), std::string::npos) << fit.status().message();
  // exp+c heading below 0 (every loss observed is >= 0): rejected, exp (no floor) kept.
  o.families = {LossFamily::kExpOffset};
  const std::vector<LossSample> negative_floor = Sample(LossCurve::ExpOffset(2.0, 0.01, -0.2), 0, 100);
  for (const LossSample& s : negative_floor) ASSERT_GE(s.loss, 0);
  fit = FitLossCurve(negative_floor, o);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("< 0 by iteration 400"), std::string::npos) << fit.status().message();
  o.monotone = false;
  EXPECT_TRUE(FitLossCurve(negative_floor, o).ok());
}

TEST(LossFit, BoundedExtrapolationHoldsTheCurveFlat) {
  const LossCurve truth = LossCurve::ExpOffset(2.0, 0.01, 0.1);
  FitOptions o;
  o.max_extrapolation = 1.0;
  Result<LossFit> fit = FitLossCurve(Sample(truth, 0, 100), o);
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->curve.flat_after(), 200);  // 100 + 1 x the 100 iterations observed
  EXPECT_NEAR(fit->curve.value(150), truth.value(150), 1e-9);
  EXPECT_NEAR(fit->curve.value(1000), truth.value(200), 1e-9);
  EXPECT_EQ(fit->curve.derivative(300), 0.0);
  EXPECT_NE(fit->curve.ToString().find("(flat after x = 200)"), std::string::npos) << fit->curve.ToString();
  EXPECT_FALSE(std::isfinite(fit->curve.FlatAfter(INFINITY).flat_after()));
  o.holdout = 0.7;
  EXPECT_NE(FitLossCurve(Sample(truth, 0, 100), o).status().message().find("holdout 0.7"), std::string::npos);
}

TEST(LossFit, BadSamplesGiveClearErrors) {
  EXPECT_NE(FitLossCurve({}).status().message().find("empty"), std::string::npos);
  const std::vector<LossSample> backwards = {{0, 1.0}, {5, 0.9}, {5, 0.8}};
  EXPECT_NE(FitLossCurve(backwards).status().message().find("strictly increasing"), std::string::npos);
  const std::vector<LossSample> nan = {{0, 1.0}, {1, std::nan("")}, {2, 0.8}};
  EXPECT_NE(FitLossCurve(nan).status().message().find("not finite"), std::string::npos);
  const std::vector<LossSample> two = {{0, 1.0}, {1, 0.9}};
  Result<LossFit> few = FitLossCurve(two);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("need at least"), std::string::npos) << few.status().message();
  FitOptions even;
  even.smoothing_window = 4;
  EXPECT_NE(FitLossCurve(Sample(LossCurve::Exp(1, 0.1), 0, 50), even).status().message().find("odd"),
            std::string::npos);
}

TEST(LossLog, ParsesAValidLog) {
  Result<std::vector<LossSample>> log = ParseLossLog("iteration,loss\r\n0,2.5\r\n\n10, 1.25e0\r\n20,1\n");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_EQ(log->size(), 3u);
  EXPECT_EQ((*log)[1].iteration, 10);
  EXPECT_DOUBLE_EQ((*log)[1].loss, 1.25);
}

TEST(LossLog, RejectsBadLogsWithTheLine) {
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"", "empty"},
      {"\n\n", "empty"},
      {"iteration,loss\n", "no data rows"},
      {"0,1.0\n1,0.9\n", ":1: missing header"},
      {"step,loss\n0,1\n", "missing header"},
      {"iteration,loss\n0,1.0\nx,0.9\n", ":3: iteration 'x' is not an integer"},
      {"iteration,loss\n0,1.0\n1,abc\n", ":3: loss 'abc' is not a number"},
      {"iteration,loss\n0,1.0\n1,nan\n", ":3: loss 'nan' is not finite"},
      {"iteration,loss\n0,1.0\n1,inf\n", "not finite"},
      {"iteration,loss\n0,1.0\n0,0.9\n", ":3: iteration 0 does not follow 0"},
      {"iteration,loss\n5,1.0\n3,0.9\n", "strictly increasing"},
      {"iteration,loss\n0,1.0,7\n", "more"},
      {"iteration,loss\n0\n", "expected 'iteration,loss'"},
      {"iteration,loss\n-1,1.0\n", "negative"},
      {"iteration,loss\n1.5,1.0\n", "not an integer"},
      {"iteration,loss\n1,\n", "not a number"},
  };
  for (const Case& c : cases) {
    Result<std::vector<LossSample>> log = ParseLossLog(c.text, "log.csv");
    ASSERT_FALSE(log.ok()) << c.text;
    EXPECT_EQ(log.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(log.status().message().find(c.want), std::string::npos) << c.text << " -> " << log.status().message();
    EXPECT_EQ(log.status().message().rfind("log.csv", 0), 0u) << log.status().message();
    EXPECT_EQ(log.status().message().find('\n'), std::string::npos);
  }
}

TEST(LossLog, ReadsFilesAndNamesMissingOnes) {
  const std::string path = ::testing::TempDir() + "viper_loss_log_test.csv";
  {
    std::ofstream out(path);
    out << "iteration,loss\n1,0.5\n2,0.25\n";
  }
  Result<std::vector<LossSample>> log = ReadLossLog(path);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->size(), 2u);
  std::remove(path.c_str());
  Result<std::vector<LossSample>> missing = ReadLossLog(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos) << missing.status().message();
}

TEST(LossLog, RefusesWhatIsNotAWholeFileOfALogsSize) {
  Result<std::vector<LossSample>> device = ReadLossLog("/dev/zero");  // would be read forever
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("not a regular file"), std::string::npos) << device.status().message();
  const std::string path = ::testing::TempDir() + "viper_loss_log_huge.csv";
  {
    std::ofstream out(path);
    out << "iteration,loss\n1,0.5\n";
  }
  std::filesystem::resize_file(path, (1ull << 30) + 1);  // sparse: no disk used
  Result<std::vector<LossSample>> huge = ReadLossLog(path);
  std::remove(path.c_str());
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("at most 1073741824 bytes"), std::string::npos) << huge.status().message();
}

}  // namespace
}  // namespace viper
