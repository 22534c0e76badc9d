#include "viper/metrics.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <limits>

namespace viper {
namespace {

constexpr std::string_view kHistPrefix = "hist_";
constexpr std::string_view kSumSuffix = "_us_sum";
constexpr std::string_view kBucketInfix = "_us_le_";
constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();

bool ValidName(std::string_view name) {
  return !name.empty() && name.size() <= 128 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

struct Known {
  const char* help;
  bool gauge;
};

// The node's counters (NodeStats), their meaning and kind.
const std::map<std::string_view, Known>& KnownCounters() {
  static const std::map<std::string_view, Known> known = {
      {"versions_committed", {"Versions committed (sealed and announced) by this node.", false}},
      {"notifies_sent", {"NOTIFY messages sent to subscribers.", false}},
      {"leases_granted", {"Same-host leases granted on versions.", false}},
      {"leases_active", {"Same-host leases held now.", true}},
      {"peers", {"Connected peers.", true}},
      {"models", {"Models the node tracks (with versions, or subscribed to).", true}},
      {"peers_refused", {"Peers refused (token, protocol version, too many bad messages).", false}},
      {"handshakes_refused_token", {"Handshakes refused for a missing or wrong token.", false}},
      {"handshakes_timed_out", {"Handshakes that did not finish in time.", false}},
      {"handshakes_evicted", {"Pending handshakes evicted by newer ones.", false}},
      {"handshakes_malformed", {"Handshakes refused as malformed.", false}},
      {"peers_silent", {"Peers dropped because they stopped answering pings (host down or cut off).", false}},
      {"peers_stalled", {"Peers dropped because no bulk transfer with them completed for peer_transfer_stall.", false}},
      {"malformed_messages", {"Malformed messages received.", false}},
      {"files_flushed", {"Versions written to the file tier.", false}},
      {"flush_errors", {"File-tier writes that failed.", false}},
      {"flushes_queued", {"Versions waiting for the file tier.", true}},
      {"unflushed_versions", {"Versions whose flush failed, kept in memory until a retry writes them.", true}},
      {"unflushed_bytes", {"Bytes of the unflushed versions.", true}},
      {"versions_delisted", {"Listed versions lost (no tier held them any more).", false}},
      {"leases_from_file", {"Same-host leases of versions loaded back from the file tier.", false}},
      {"bytes_sent", {"Version bytes sent to peers (per completed chunk).", false}},
      {"bytes_sent_incoming", {"Version bytes sent before the version was complete here.", false}},
      {"incoming_versions", {"Versions received from another node (relay transfers).", false}},
      {"incoming_aborted", {"Relay transfers that broke before commit.", false}},
      {"produced_early", {"Versions announced to remote readers while the producer still wrote them (cut-through).", false}},
      {"delta_encoded", {"Deltas encoded to the end.", false}},
      {"delta_encoded_bytes", {"Bytes of the deltas encoded.", false}},
      {"delta_target_bytes", {"Bytes of the versions the deltas encode.", false}},
      {"delta_cancelled", {"Delta encodes stopped (base evicted, not smaller).", false}},
      {"delta_skipped", {"Eager delta encodes not started (deltas did not pay).", false}},
      {"delta_sent", {"Delta streams sent to consumers.", false}},
      {"delta_sent_bytes", {"Bytes of delta streams sent.", false}},
      {"delta_declined", {"FETCHes that offered a base and got the full snapshot.", false}},
      {"delta_forwarded", {"Relay: deltas received from the upstream and kept to pass on as they arrive (none encoded here).", false}},
      {"delta_forwarded_bytes", {"Relay: bytes of those deltas.", false}},
      {"host_writing_segments", {"Host-tier segments being written.", true}},
      {"host_committed_segments", {"Host-tier segments holding committed versions.", true}},
      {"host_retired_leased_segments", {"Host-tier segments retired but still leased.", true}},
      {"host_free_segments", {"Host-tier segments free for reuse.", true}},
      {"upstream_subscriptions", {"Relay: models subscribed from an upstream.", true}},
      {"upstream_connected", {"Relay: upstream subscriptions connected now.", true}},
      {"upstream_on_preferred", {"Relay: upstream subscriptions on their preferred upstream now.", true}},
      {"upstream_connect_failures", {"Relay: failed attempts to connect to an upstream.", false}},
      {"upstream_preferred_returns", {"Relay: returns from an alternate to the preferred upstream.", false}},
      {"upstream_liveness_failures", {"Relay: upstream connections given up because the upstream stopped answering (host or link lost).", false}},
  };
  return known;
}

const char* HistogramHelp(std::string_view name) {
  if (name == "publish_live") return "Seconds from publish() to the version announced (NOTIFY sent) at this node.";
  if (name == "fetch_send") return "Seconds from a FETCH answered by SEND to its last chunk sent.";
  return "Latency histogram.";
}

// Microseconds as exact decimal seconds ("0.00025", "1", "12.5").
std::string Seconds(uint64_t us) {
  std::string text = std::to_string(us / 1000000);
  if (uint64_t frac = us % 1000000; frac != 0) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%06" PRIu64, frac);
    std::string digits(buf);
    digits.erase(digits.find_last_not_of('0') + 1);
    text += "." + digits;
  }
  return text;
}

}  // namespace

uint64_t LatencyHistogram::count() const {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

void LatencyRecorder::Record(int64_t duration_ns) {
  const uint64_t us = duration_ns <= 0 ? 0 : static_cast<uint64_t>(duration_ns) / 1000;
  const size_t i = static_cast<size_t>(std::lower_bound(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end(), us) -
                                       kLatencyBoundsUs.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(us, std::memory_order_relaxed);
}

LatencyHistogram LatencyRecorder::Snapshot() const {
  LatencyHistogram h;
  for (size_t i = 0; i < kLatencyBuckets; ++i) h.counts[i] = counts_[i].load(std::memory_order_relaxed);
  h.sum_us = sum_us_.load(std::memory_order_relaxed);
  return h;
}

void AddHistogramCounters(std::map<std::string, uint64_t>& counters, std::string_view name, const LatencyHistogram& h) {
  const std::string base = std::string(kHistPrefix) + std::string(name);
  for (size_t i = 0; i < kLatencyBuckets; ++i) {
    std::string bound = i < kLatencyBoundsUs.size() ? std::to_string(kLatencyBoundsUs[i]) : "inf";
    counters[base + std::string(kBucketInfix) + bound] = h.counts[i];
  }
  counters[base + std::string(kSumSuffix)] = h.sum_us;
}

uint64_t NamedHistogram::count() const {
  uint64_t n = 0;
  for (const auto& [bound, c] : buckets) n += c;
  return n;
}

bool IsHistogramCounter(std::string_view name) { return name.starts_with(kHistPrefix); }

std::vector<NamedHistogram> HistogramsFromCounters(const std::map<std::string, uint64_t>& counters) {
  std::map<std::string, NamedHistogram> found;
  for (const auto& [key, value] : counters) {
    std::string_view rest(key);
    if (!rest.starts_with(kHistPrefix)) continue;
    rest.remove_prefix(kHistPrefix.size());
    if (rest.ends_with(kSumSuffix)) {
      std::string_view name = rest.substr(0, rest.size() - kSumSuffix.size());
      if (!ValidName(name)) continue;
      NamedHistogram& h = found[std::string(name)];
      h.name = name;
      h.sum_us = value;
      continue;
    }
    const size_t at = rest.rfind(kBucketInfix);
    if (at == std::string_view::npos) continue;
    std::string_view name = rest.substr(0, at), bound_text = rest.substr(at + kBucketInfix.size());
    if (!ValidName(name)) continue;
    uint64_t bound = 0;
    if (bound_text == "inf") {
      bound = kInf;
    } else {
      if (bound_text.empty() || bound_text.size() > 19 || (bound_text[0] == '0' && bound_text.size() > 1)) continue;
      auto [end, ec] = std::from_chars(bound_text.data(), bound_text.data() + bound_text.size(), bound);
      if (ec != std::errc() || end != bound_text.data() + bound_text.size()) continue;
    }
    NamedHistogram& h = found[std::string(name)];
    h.name = name;
    h.buckets.emplace_back(bound, value);
  }
  std::vector<NamedHistogram> out;
  for (auto& [name, h] : found) {
    std::sort(h.buckets.begin(), h.buckets.end());  // map order is textual: "1000" before "250"
    out.push_back(std::move(h));
  }
  return out;
}

std::string PrometheusText(const std::map<std::string, uint64_t>& counters) {
  std::string out;
  char line[512];
  for (const auto& [name, value] : counters) {
    if (IsHistogramCounter(name) || !ValidName(name)) continue;
    auto known = KnownCounters().find(name);
    const bool is_known = known != KnownCounters().end();
    const char* type = !is_known ? "untyped" : known->second.gauge ? "gauge" : "counter";
    const std::string metric = "viper_" + name + (is_known && !known->second.gauge ? "_total" : "");
    std::snprintf(line, sizeof(line), "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", metric.c_str(),
                  is_known ? known->second.help : "A node counter this viper does not know.", metric.c_str(), type,
                  metric.c_str(), value);
    out += line;
  }
  for (const NamedHistogram& h : HistogramsFromCounters(counters)) {
    const std::string metric = "viper_" + h.name + "_seconds";
    out += "# HELP " + metric + " " + HistogramHelp(h.name) + "\n";
    out += "# TYPE " + metric + " histogram\n";
    uint64_t cumulative = 0;
    for (const auto& [bound, c] : h.buckets) {
      cumulative += c;
      if (bound == kInf) continue;
      out += metric + "_bucket{le=\"" + Seconds(bound) + "\"} " + std::to_string(cumulative) + "\n";
    }
    out += metric + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
    out += metric + "_sum " + Seconds(h.sum_us) + "\n";
    out += metric + "_count " + std::to_string(cumulative) + "\n";
  }
  return out;
}

}  // namespace viper
