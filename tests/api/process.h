// Test helpers: child processes (real programs, spawned and killed for real) and temp dirs.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"

extern char** environ;

namespace viper::testing {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `pred` every 10 ms until it holds or `timeout` passes (a test's wait, not a product path).
template <typename Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A node counts a chunk in bytes_sent when UCX completes its send, and that completion can reach
// the sender after the receiver already has the chunk: a test reads a total (or takes a baseline)
// once the counter has reached `floor` (what the test knows was sent, if it knows) and stopped
// moving: two reads 200 ms apart that agree (all within `timeout`).
template <typename Read>
uint64_t Settled(Read read, uint64_t floor = 0, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  uint64_t last = read();
  while (last < floor && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    last = read();
  }
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto now = read();
    if (now == last) break;
    last = now;
  }
  return last;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "viper-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// A node killed with SIGKILL leaves its shared-memory segments (/dev/shm/<prefix>.<pid>.<seq>)
// for a restart on the same store to recover. Tests kill nodes on stores in temp dirs that nobody
// restarts afterwards, so those segments would stay until reboot (a suite run left ~1 GB, and
// repeated runs filled /dev/shm until the OOM killer took tests). Every pid a test spawns is
// remembered; when the test binary exits, the segments of those that are dead go. Nothing is
// removed while the binary runs, so a test that restarts a killed node still finds them.
class SpawnedSegments {
 public:
  static void Remember(pid_t pid) {
    // The list and the mutex exist before Sweep is registered, so they outlive it at exit.
    std::vector<pid_t>& pids = Pids();
    std::lock_guard<std::mutex> lock(Mu());
    static const bool registered = (std::atexit(Sweep), true);
    (void)registered;
    pids.push_back(pid);
  }
  // Unlinks /dev/shm/<prefix>.<pid>.<seq> owned by this user for every remembered pid that is
  // no longer running (a recycled pid that now runs another program keeps its files).
  static void Sweep() {
    std::vector<pid_t> dead;
    {
      std::lock_guard<std::mutex> lock(Mu());
      for (pid_t pid : Pids())
        if (::kill(pid, 0) != 0 && errno == ESRCH) dead.push_back(pid);
    }
    if (dead.empty()) return;
    DIR* dir = ::opendir("/dev/shm");
    if (dir == nullptr) return;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      auto last = name.rfind('.');
      if (last == std::string::npos || last == 0) continue;
      auto before = name.rfind('.', last - 1);
      if (before == std::string::npos) continue;
      std::string pid_text = name.substr(before + 1, last - before - 1);
      if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
      pid_t pid = static_cast<pid_t>(std::stol(pid_text));
      if (std::find(dead.begin(), dead.end(), pid) == dead.end()) continue;
      struct stat st {};
      std::string path = "/dev/shm/" + name;
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) ::unlink(path.c_str());
    }
    ::closedir(dir);
  }

 private:
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static std::vector<pid_t>& Pids() {
    static std::vector<pid_t> pids;
    return pids;
  }
};

class Process {
 public:
  // Starts argv[0] with stdout and stderr appended to `log`.
  Process(std::vector<std::string> argv, const std::filesystem::path& log) : log_(log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    if (pid_ > 0) SpawnedSegments::Remember(pid_);
  }
  ~Process() {
    if (running()) Kill(SIGKILL);
  }
  Process(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() {
    if (pid_ <= 0 || exited_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = status;
      return false;
    }
    return true;
  }
  void Kill(int sig) {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, sig);
      Wait();
    }
  }
  // Exit code (or 128+signal); -1 if it did not end within the timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (!WaitUntil([&] { return !running(); }, timeout)) return -1;
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    return 128 + WTERMSIG(status_);
  }
  std::string log() const { return ReadFile(log_); }
  // CPU seconds (user + system) the process has used so far, from /proc.
  double CpuSeconds() const {
    std::string stat = ReadFile("/proc/" + std::to_string(pid_) + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream in(stat.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::filesystem::path log_;
};

inline std::string PeerBinary() { return std::string(VIPER_BINARY_DIR) + "/bin/viper_test_peer"; }
inline std::string ViperBinary() { return std::string(VIPER_BINARY_DIR) + "/bin/viper"; }

// Waits for a file written atomically by a child and returns its first line.
inline std::string WaitForFile(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  std::string line;
  WaitUntil(
      [&] {
        std::ifstream in(path);
        return in && std::getline(in, line) && !line.empty();
      },
      timeout);
  return line;
}

}  // namespace viper::testing
