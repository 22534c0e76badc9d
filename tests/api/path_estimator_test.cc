// PathEstimator (src/api/path_estimator.h): ranks a subscriber's fetch paths by predicted time from
// its own measurements, except that on the node's host map goes first whatever was measured.
#include <gtest/gtest.h>

#include <vector>

#include "path_estimator.h"

namespace viper::internal {
namespace {

constexpr uint64_t kBytes = 64ull << 20;
constexpr int64_t kSecond = 1'000'000'000;

std::vector<FetchPath> PathsOf(const std::vector<PathChoice>& ranked) {
  std::vector<FetchPath> out;
  for (const auto& c : ranked) out.push_back(c.path);
  return out;
}

TEST(PathEstimator, RanksByDefaultsBeforeAnyMeasurement) {
  PathEstimator e;
  auto ranked = e.Rank({FetchPath::kMap, FetchPath::kCopy, FetchPath::kRemote, FetchPath::kFile}, kBytes, true, true);
  EXPECT_EQ(PathsOf(ranked), (std::vector{FetchPath::kMap, FetchPath::kCopy, FetchPath::kRemote, FetchPath::kFile}));
  EXPECT_NE(ranked[0].reason.find("(default)"), std::string::npos) << ranked[0].reason;
  EXPECT_NE(ranked[0].reason.find("same host"), std::string::npos) << ranked[0].reason;
}

// The measurement decides between paths that move the bytes: a slow network falls behind a fast file tier.
TEST(PathEstimator, MeasurementsReorderTheOtherPaths) {
  PathEstimator e;
  e.Record(FetchPath::kRemote, kBytes, 2 * kSecond);        // 32 MiB/s
  e.Record(FetchPath::kFile, kBytes, kSecond / 10);         // 640 MiB/s
  auto ranked = e.Rank({FetchPath::kRemote, FetchPath::kFile}, kBytes, false, true);
  EXPECT_EQ(PathsOf(ranked), (std::vector{FetchPath::kFile, FetchPath::kRemote}));
  EXPECT_NE(ranked[0].reason.find("(measured)"), std::string::npos) << ranked[0].reason;
  EXPECT_NE(ranked[0].reason.find("other host"), std::string::npos) << ranked[0].reason;
}

// One map slowed by a loaded machine (a 1 s lease round trip) and a fast copy after it (through the
// mapping the map left warm): before, the subscriber then stayed on copy, or on its node's remote
// path, for good. Map stays first on the node's host; the rest keep their measured order.
TEST(PathEstimator, MapStaysFirstOnTheNodesHostAfterASlowMap) {
  PathEstimator e;
  e.Record(FetchPath::kMap, kBytes, kSecond);
  e.Record(FetchPath::kCopy, kBytes, kSecond / 100);
  e.Record(FetchPath::kRemote, kBytes, kSecond / 200);
  auto ranked = e.Rank({FetchPath::kMap, FetchPath::kCopy, FetchPath::kRemote}, kBytes, true, true);
  EXPECT_EQ(PathsOf(ranked), (std::vector{FetchPath::kMap, FetchPath::kRemote, FetchPath::kCopy}));
  EXPECT_GT(ranked[0].predicted_s, ranked[1].predicted_s) << "the prediction is still shown as measured";
  // Away from the node's host there is no map to put first: pure prediction.
  ranked = e.Rank({FetchPath::kMap, FetchPath::kCopy, FetchPath::kRemote}, kBytes, false, true);
  EXPECT_EQ(PathsOf(ranked), (std::vector{FetchPath::kRemote, FetchPath::kCopy, FetchPath::kMap}));
}

TEST(PathEstimator, IgnoresTransfersTooSmallToMeasure) {
  PathEstimator e;
  e.Record(FetchPath::kRemote, 4096, kSecond);  // under 1 MiB: latency, not bandwidth
  auto ranked = e.Rank({FetchPath::kRemote}, kBytes, false, true);
  EXPECT_NE(ranked[0].reason.find("(default)"), std::string::npos) << ranked[0].reason;
}

}  // namespace
}  // namespace viper::internal
