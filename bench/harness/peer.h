// The consumer processes of `viper bench` (run as `viper bench-peer ...`, hidden; in the consumer's
// network namespace for --hosts 2). Each prints one JSON object per line on stdout, first
// {"ready":true,...} once it is able to see a version, and returns when its stdin closes (the
// bench closes it, or dies).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "viper/status.h"
#include "viper/subscriber.h"

namespace viper::bench {

// One JSON object as one line on stdout, flushed (thread-safe).
void PrintLine(const nlohmann::json& j);
// Blocks until stdin reaches EOF (the bench closed it) or `timeout_ms` passes (-1: forever).
// Returns true on EOF.
bool StdinClosed(int timeout_ms);

// A viper::Subscriber with `options`; one line per version swapped in, with its timings
// (CLOCK_REALTIME ns: publish, completed, notified, fetched, verified, live).
Status RunSubscriberPeer(const SubscriberOptions& options);

// The baseline users run today: every `interval_s` seconds (fixed grid, as TensorFlow Serving's
// file_system_poll_wait_seconds) list `dir` for <version>.safetensors, read the newest new one
// into a reused buffer and parse it; one line per version loaded (found_ns, live_ns). Its ready
// line says where the grid is: polls at grid_ns + k * interval_s (CLOCK_REALTIME, k >= 1).
Status RunPollerPeer(const std::string& dir, double interval_s);

// The fan-out baseline of `viper bench --subscribers`: sleeps in poll(2) on stdin and prints
// {"woken_ns":...} (CLOCK_REALTIME) for every line the bench writes; the physical cost of waking a
// sleeping process with a message, without Viper.
Status RunWakePeer();

}  // namespace viper::bench
