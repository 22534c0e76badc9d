// Child processes for `viper bench`: a peer whose stdout the bench reads line by line (consumers,
// pollers, servers), and a run-to-completion helper that captures stdout (baselines).
//
// A LineChild owns the child: its destructor closes the child's stdin (our peers exit on EOF),
// waits briefly, then kills it with SIGKILL. Not thread-safe: one thread drives one child.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "viper/status.h"

namespace viper::bench {

class LineChild {
 public:
  // Starts argv (argv[0] is searched in PATH) with stdin and stdout piped to us; stderr is
  // appended to `stderr_log` (empty: inherited).
  static Result<std::unique_ptr<LineChild>> Start(const std::vector<std::string>& argv,
                                                  const std::string& stderr_log = "");
  ~LineChild();
  LineChild(const LineChild&) = delete;
  LineChild& operator=(const LineChild&) = delete;

  // The next line of the child's stdout (without '\n'). Timeout if none within `timeout`;
  // Unavailable if the child closed its stdout (exited), naming its exit status.
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Writes `text` to the child's stdin (all of it, or an error naming the child).
  Status Write(const std::string& text);
  // Closes the child's stdin and waits up to `grace` for it to exit, then SIGKILLs it.
  // Returns the exit code (128+signal if killed by one).
  int Stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

 private:
  LineChild() = default;
  int WaitExit(std::chrono::milliseconds timeout);  // -1 if still running
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string name_;
  std::string pending_;  // bytes read past the last returned line
};

// Runs argv to completion (at most `timeout`, then SIGKILL) and returns its stdout. A non-zero exit
// is an error that quotes the tail of its output and `stderr_log`.
Result<std::string> RunCapture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                               const std::string& stderr_log = "");

// Absolute path of the running executable (/proc/self/exe).
std::string SelfExe();

// A TCP port free on `ip` at the time of the call, for a server child the bench starts a moment
// later. Drawn at random from below the kernel's ephemeral range (32768-60999 by default): a port
// that bind(0) hands out and that is released again can be taken by any process's next outgoing
// connection before the server listens; outgoing connections never take one below that range.
Result<uint16_t> FreeTcpPort(const std::string& ip = "127.0.0.1");

}  // namespace viper::bench
