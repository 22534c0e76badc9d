// libFuzzer target for the control-protocol decoder: any byte string must decode to a message or
// an error, never crash; a decoded message must re-encode to the same bytes (the encoding is
// canonical, except for map order which Encode normalises, so compare after a second round).
// A STATS_REPLY's counters also go through what `viper stats --prometheus` makes of them (the
// histograms named among them, the text exposition).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "net/protocol.h"
#include "viper/metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(data), size);
  auto decoded = viper::proto::Decode(frame);
  if (!decoded.ok()) return 0;
  auto encoded = viper::proto::Encode(*decoded);
  auto again = viper::proto::Decode(encoded);
  if (!again.ok() || !(*again == *decoded)) std::abort();
  if (viper::proto::Encode(*again) != encoded) std::abort();
  if (const auto* stats = std::get_if<viper::proto::StatsReply>(&*decoded)) {
    for (const auto& h : viper::HistogramsFromCounters(stats->counters)) {
      for (size_t i = 1; i < h.buckets.size(); ++i)
        if (h.buckets[i - 1].first >= h.buckets[i].first) std::abort();  // bounds ascending, unique
    }
    const std::string text = viper::PrometheusText(stats->counters);
    if (!text.empty() && text.back() != '\n') std::abort();
  }
  return 0;
}
