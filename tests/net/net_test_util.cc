#include "net/net_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "api/free_port.h"

namespace viper::net::testing {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Word(uint64_t seed, uint64_t index) { return Mix(seed * 0x100000001b3ULL + index); }

}  // namespace

void FillPattern(std::span<std::byte> out, uint64_t seed, uint64_t offset) {
  uint64_t base = offset / 8;
  size_t words = out.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = Word(seed, base + i);
    std::memcpy(out.data() + i * 8, &w, 8);
  }
  if (size_t tail = out.size() % 8; tail != 0) {
    uint64_t w = Word(seed, base + words);
    std::memcpy(out.data() + words * 8, &w, tail);
  }
}

int64_t FindPatternMismatch(std::span<const std::byte> data, uint64_t seed, uint64_t offset) {
  std::vector<std::byte> expected(4096);
  for (size_t pos = 0; pos < data.size(); pos += expected.size()) {
    size_t n = std::min(expected.size(), data.size() - pos);
    FillPattern({expected.data(), n}, seed, offset + pos);
    if (std::memcmp(expected.data(), data.data() + pos, n) != 0) {
      for (size_t i = 0; i < n; ++i) {
        if (expected[i] != data[pos + i]) return static_cast<int64_t>(pos + i);
      }
    }
  }
  return -1;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string AsString(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string HelperPath(const char* name) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + name;
}

// ---------------------------------------------------------------- ChildProcess

std::optional<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv,
                                                const std::vector<std::string>& env) {
  int in_pipe[2];
  int out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return std::nullopt;
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return std::nullopt;
  // setpriv (util-linux) sets the parent-death signal, then execs the program.
  static const std::string kSetpriv = "/usr/bin/setpriv";
  std::vector<std::string> wrapped = {kSetpriv, "--pdeathsig", "KILL", "--"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  std::vector<char*> args;
  for (const std::string& a : wrapped) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& e : env) env_strings.push_back(e);
  std::string ucx_dir;
  auto sets_posix_dir = [](const std::string& e) { return e.rfind("UCX_POSIX_DIR=", 0) == 0; };
  if (std::none_of(env_strings.begin(), env_strings.end(), sets_posix_dir)) {
    static std::atomic<int> children{0};
    ucx_dir = "/dev/shm/viper-test-ucx." + std::to_string(getpid()) + "." + std::to_string(children++);
    if (mkdir(ucx_dir.c_str(), 0700) == 0) {
      env_strings.push_back("UCX_POSIX_DIR=" + ucx_dir);
    } else {
      ucx_dir.clear();  // e.g. no /dev/shm: UCX then fails or uses its default, as without us
    }
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) close(fd);
    if (!ucx_dir.empty()) rmdir(ucx_dir.c_str());
    return std::nullopt;
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  ChildProcess child;
  child.pid_ = pid;
  child.stdin_fd_ = in_pipe[1];
  child.stdout_fd_ = out_pipe[0];
  child.ucx_dir_ = std::move(ucx_dir);
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), stdin_fd_(other.stdin_fd_), stdout_fd_(other.stdout_fd_),
      buffer_(std::move(other.buffer_)), reaped_(other.reaped_), ucx_dir_(std::move(other.ucx_dir_)),
      ucx_files_removed_(other.ucx_files_removed_) {
  other.pid_ = -1;
  other.stdin_fd_ = -1;
  other.stdout_fd_ = -1;
  other.ucx_dir_.clear();
}

ChildProcess::~ChildProcess() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (pid_ > 0 && !reaped_ && Wait(std::chrono::seconds(10)) == -1) {
    Kill(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  RemoveUcxDir();  // (if the child could not be reaped, what it may still use goes with it)
}

// Only once the child is dead: a live one's files are unlinked by UCX itself right after creation.
void ChildProcess::RemoveUcxDir() {
  if (ucx_dir_.empty()) return;
  if (DIR* dir = opendir(ucx_dir_.c_str())) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (unlink((ucx_dir_ + "/" + name).c_str()) == 0) ++ucx_files_removed_;
    }
    closedir(dir);
  }
  rmdir(ucx_dir_.c_str());
  ucx_dir_.clear();
}

std::optional<std::string> ChildProcess::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{stdout_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) return std::nullopt;
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<std::string> ChildProcess::WaitFor(const std::string& prefix, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    std::optional<std::string> line = ReadLine(left);
    if (!line) return std::nullopt;
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
}

void ChildProcess::Kill(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      RemoveUcxDir();
      return status;
    }
    if (r < 0 || std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

double ChildProcess::CpuSeconds() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = content.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(content.substr(paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (fields >> field); ++i) {  // field 3 is the state
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// ---------------------------------------------------------------- EventLog

EngineHandlers EventLog::Handlers() {
  EngineHandlers h;
  h.on_message = [this](PeerId peer, std::span<const std::byte> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(Message{peer, std::vector<std::byte>(bytes.begin(), bytes.end())});
    cv_.notify_all();
  };
  h.on_peer_accepted = [this](PeerId peer, const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    accepted_.emplace_back(peer, address);
    cv_.notify_all();
  };
  h.on_peer_closed = [this](PeerId peer, const Status& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.emplace(peer, reason);
    cv_.notify_all();
  };
  return h;
}

std::optional<EventLog::Message> EventLog::NextMessage(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !messages_.empty(); })) return std::nullopt;
  Message m = std::move(messages_.front());
  messages_.pop_front();
  return m;
}

std::optional<Status> EventLog::WaitClosed(PeerId peer, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return closed_.count(peer) != 0; })) return std::nullopt;
  return closed_.at(peer);
}

std::optional<std::pair<PeerId, std::string>> EventLog::WaitAccepted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !accepted_.empty(); })) return std::nullopt;
  auto a = accepted_.front();
  accepted_.pop_front();
  return a;
}

size_t EventLog::closed_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_.size();
}

// ---------------------------------------------------------------- CompletionLatch

CompletionLatch::CompletionLatch() : state_(std::make_shared<State>()) {}

Completion CompletionLatch::Callback() {
  return [state = state_](const Status& st) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->calls++;
    if (!state->status) state->status = st;
    state->cv.notify_all();
  };
}

std::optional<Status> CompletionLatch::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->status.has_value(); })) return std::nullopt;
  return state_->status;
}

int CompletionLatch::calls() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->calls;
}

uint16_t UnusedPort() { return viper::testing::PickFreePort(); }

}  // namespace viper::net::testing
