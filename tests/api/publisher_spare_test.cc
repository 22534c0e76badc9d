// The Publisher makes the host tier's next segment in the background after each commit
// (HostTier::KeepSpare), so that only the very first publish of a model creates a segment on the
// caller's thread: every later one recycles, also while the retained versions still fill up.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "store/host_tier.h"
#include "viper/node.h"
#include "viper/publisher.h"

namespace viper {
namespace {

using namespace std::chrono_literals;

// Waits until the tier holds `n` segments made by KeepSpare.
bool WaitForSpares(Publisher& pub, uint64_t n) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pub.node().host_tier().stats().spare_segments >= n) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

void PublishesAfterTheFirstRecycle(PublishMode mode) {
  PublisherOptions options;
  options.model = "m";
  options.mode = mode;
  options.node.segment_prefix = mode == PublishMode::kSync ? "viper-spare-sync" : "viper-spare-async";
  auto pub = Publisher::Start(options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  std::vector<float> weights(4 << 20, 1.0f);  // 16 MiB
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {static_cast<int64_t>(weights.size())}},
                                      std::as_bytes(std::span<const float>(weights))}};
  const uint64_t keep = (*pub)->node().host_tier().options().keep_versions;
  for (uint64_t v = 1; v <= keep + 3; ++v) {
    auto r = (*pub)->Publish(tensors, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->recycled, v > 1) << "publish " << v;
    ASSERT_TRUE((*pub)->Wait().ok());
    // The spare for the next publish, while fewer than keep_versions + 1 segments exist.
    if (v <= keep) {
      ASSERT_TRUE(WaitForSpares(**pub, v)) << "no spare after publish " << v;
    }
  }
  HostTierStats s = (*pub)->node().host_tier().stats();
  EXPECT_EQ(s.fresh_allocations, 1u);
  EXPECT_EQ(s.spare_segments, keep);
  EXPECT_EQ(s.recycled_allocations, keep + 2);
}

TEST(PublisherSpare, SyncPublishesAfterTheFirstRecycle) { PublishesAfterTheFirstRecycle(PublishMode::kSync); }
TEST(PublisherSpare, AsyncPublishesAfterTheFirstRecycle) { PublishesAfterTheFirstRecycle(PublishMode::kAsync); }

}  // namespace
}  // namespace viper
