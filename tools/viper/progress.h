// A progress bar on stderr for the commands that move a whole version (publish, pull): drawn only
// when stderr is a terminal, so that scripts, pipes and --json consumers never see it.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "viper/units.h"

namespace viper::cli {

class ProgressBar {
 public:
  // Enabled when stderr is a terminal. `label` starts the line ("sending", "writing").
  static std::shared_ptr<ProgressBar> ForStderr(std::string label) {
    return std::make_shared<ProgressBar>(::isatty(STDERR_FILENO) == 1, std::move(label));
  }
  ProgressBar(bool enabled, std::string label) : enabled_(enabled), label_(std::move(label)) {}

  bool enabled() const { return enabled_; }

  // Thread-safe; calls may come from several threads and out of order (the bar never goes back).
  // Redraws at most every 50 ms, and always at done == total (then ends the line).
  void Update(uint64_t done, uint64_t total) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || done < shown_) return;
    auto now = std::chrono::steady_clock::now();
    bool last = done >= total;
    if (!last && drawn_once_ && now - last_draw_ < std::chrono::milliseconds(50)) return;
    shown_ = done;
    last_draw_ = now;
    drawn_once_ = true;
    constexpr int kWidth = 40;
    int filled = total ? static_cast<int>(kWidth * std::min(done, total) / total) : kWidth;
    std::fprintf(stderr, "\r%s [%.*s%*s] %s / %s", label_.c_str(), filled, "########################################",
                 kWidth - filled, "", HumanBytes(static_cast<double>(done)).c_str(),
                 HumanBytes(static_cast<double>(total)).c_str());
    if (last) {
      std::fprintf(stderr, "\n");
      finished_ = true;
    }
    std::fflush(stderr);
  }

  // Ends a bar that stopped early (an error) so that the error starts on a line of its own.
  void Abandon() {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (drawn_once_ && !finished_) std::fprintf(stderr, "\n");
    finished_ = true;
  }

 private:
  const bool enabled_;
  const std::string label_;
  std::mutex mu_;
  uint64_t shown_ = 0;
  bool drawn_once_ = false, finished_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace viper::cli
