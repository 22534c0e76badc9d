// Helpers for the net tests: deterministic data patterns, a child process running the
// viper_net_test_peer helper, and a thread-safe log of engine events.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net/engine.h"

namespace viper::net::testing {

// Fills `out` with the pattern of stream `seed` starting at byte `offset` (a multiple of 8).
void FillPattern(std::span<std::byte> out, uint64_t seed, uint64_t offset);
// Index of the first byte that differs from the pattern, or -1 if all match.
int64_t FindPatternMismatch(std::span<const std::byte> data, uint64_t seed, uint64_t offset);

std::span<const std::byte> AsBytes(const std::string& s);
std::string AsString(std::span<const std::byte> bytes);

// The helper binary's path (next to the running test binary).
std::string HelperPath(const char* name = "viper_net_test_peer");

// A child process started with posix_spawn through `setpriv --pdeathsig KILL` (killed if the
// thread that started it exits); its stdout is a pipe read line by line, its stdin a pipe whose
// closing tells a well-behaved helper to exit. Killed (SIGKILL) on destruction if it does not exit
// within a few seconds. posix_spawn, not fork: a fork copies the test's page tables, which under
// ASan (its shadow mappings) made viper_net_failure_test's 120 helpers cost 7 s more.
//
// UCX's shared-memory file: UCX creates /dev/shm/ucx_shm_posix_<random> when it creates a worker
// and unlinks it at once (peers map it through /proc/PID/fd), so a child SIGKILLed in between
// leaves it behind (3 of 40 helpers killed 0-99 ms after their start). Each child therefore gets
// its own UCX_POSIX_DIR, a directory under /dev/shm (the same memory) that is removed with what it
// holds once the child is reaped: whatever is left there is that child's and nobody else's. Not
// done when the environment already sets UCX_POSIX_DIR.
class ChildProcess {
 public:
  static std::optional<ChildProcess> Start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  // Next line of stdout (without '\n'), or nullopt on EOF/timeout.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns the rest of that line.
  std::optional<std::string> WaitFor(const std::string& prefix, std::chrono::milliseconds timeout);
  void Kill(int signal);
  // Waits for exit; returns the raw wait status or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }
  // The child's UCX_POSIX_DIR (empty if none), and how many files it had left there when reaped.
  const std::string& ucx_dir() const { return ucx_dir_; }
  int ucx_files_removed() const { return ucx_files_removed_; }
  // User+system CPU seconds of the child so far (from /proc/<pid>/stat).
  double CpuSeconds() const;

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  void RemoveUcxDir();

  std::string buffer_;
  bool reaped_ = false;
  std::string ucx_dir_;
  int ucx_files_removed_ = 0;
};

// Records engine events; hands out EngineHandlers that feed it.
class EventLog {
 public:
  struct Message {
    PeerId peer;
    std::vector<std::byte> bytes;
    std::string text() const { return AsString(bytes); }
  };
  EngineHandlers Handlers();
  std::optional<Message> NextMessage(std::chrono::milliseconds timeout);
  std::optional<Status> WaitClosed(PeerId peer, std::chrono::milliseconds timeout);
  std::optional<std::pair<PeerId, std::string>> WaitAccepted(std::chrono::milliseconds timeout);
  size_t closed_count();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> messages_;
  std::map<PeerId, Status> closed_;
  std::deque<std::pair<PeerId, std::string>> accepted_;
};

// Waits for a completion on the calling thread. Copies share one state, so a callback that runs
// after the latch went out of scope is harmless. Counts how many times the callback ran.
class CompletionLatch {
 public:
  CompletionLatch();
  Completion Callback();
  std::optional<Status> Wait(std::chrono::milliseconds timeout);
  int calls();

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Status> status;
    int calls = 0;
  };
  std::shared_ptr<State> state_;
};

// A free TCP port on 127.0.0.1, below the ephemeral range (see testing::PickFreePort in api/free_port.h); nothing
// listens on it afterwards.
uint16_t UnusedPort();

}  // namespace viper::net::testing
