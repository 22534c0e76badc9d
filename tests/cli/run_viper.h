// Runs the built bin/viper as a user would (a child process) and captures what it printed: shared
// by the CLI tests of every layer (inspect, schedule, bench).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace viper::testing {

struct Outcome {
  int exit_code = -1;  // 128 + signal if a signal ended it
  std::string out, err;
};

// Runs the program `exe` with `args`; its stdout and stderr go through the files `dir`/stdout and
// `dir`/stderr (overwritten). With a `timeout`, a run still going after it is killed (SIGKILL:
// exit_code 128 + 9) and `timed_out` is set.
inline Outcome RunProgram(const std::string& exe, const std::vector<std::string>& args, const std::filesystem::path& dir,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(0), bool* timed_out = nullptr) {
  const auto out_path = dir / "stdout", err_path = dir / "stderr";
  // posix_spawn, not fork: glibc starts the child without copying the test's page tables, which
  // under ASan (terabytes of shadow mappings) made every run of the option table cost 0.33 s
  // instead of the instrumented program's own 0.18 s.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return {127, "", "posix_spawn " + exe + ": " + std::strerror(spawned) + "\n"};
  int status = 0;
  if (timed_out != nullptr) *timed_out = false;
  if (timeout.count() > 0) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid, SIGKILL);
        if (timed_out != nullptr) *timed_out = true;
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } else {
    ::waitpid(pid, &status, 0);
  }
  auto slurp = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out_path), slurp(err_path)};
}

// RunProgram for bin/viper.
inline Outcome RunViper(const std::vector<std::string>& args, const std::filesystem::path& dir,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(0), bool* timed_out = nullptr) {
  return RunProgram(std::string(VIPER_BINARY_DIR) + "/bin/viper", args, dir, timeout, timed_out);
}

}  // namespace viper::testing
