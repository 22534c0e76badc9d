// Child-process helpers of `viper bench` (see child.h).
#include "harness/child.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <random>
#include <thread>

extern char** environ;

namespace viper::bench {
namespace {

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + ::strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string Joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

}  // namespace

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("viper");
}

Result<std::unique_ptr<LineChild>> LineChild::Start(const std::vector<std::string>& argv,
                                                    const std::string& stderr_log) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::FromErrno("pipe for " + argv[0]);
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]);
    return Status::FromErrno("pipe for " + argv[0]);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (!stderr_log.empty())
    posix_spawn_file_actions_addopen(&actions, 2, stderr_log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  std::unique_ptr<LineChild> child(new LineChild());
  int rc = ::posix_spawnp(&child->pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]), ::close(out[0]);
    errno = rc;
    return Status::FromErrno("start " + Joined(argv));
  }
  child->stdin_fd_ = in[1];
  child->stdout_fd_ = out[0];
  child->name_ = argv.size() > 1 ? argv[0] + " " + argv[1] : argv[0];
  return child;
}

LineChild::~LineChild() { Stop(std::chrono::seconds(2)); }

Status LineChild::Write(const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(stdin_fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno("write to " + name_ + "'s stdin");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<std::string> LineChild::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto nl = pending_.find('\n'); nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return Status::Timeout(name_ + ": no output line within " + std::to_string(timeout.count()) + " ms");
    pollfd p{stdout_fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return Status::FromErrno("poll on " + name_);
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    int code = WaitExit(std::chrono::seconds(5));
    return Status::Unavailable(name_ + " ended (" + (code < 0 ? std::string("still running") : Describe(status_)) +
                               ") before printing the expected line");
  }
}

int LineChild::WaitExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited_) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      exited_ = true;
      status_ = status;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ExitCode(status_);
}

int LineChild::Stop(std::chrono::milliseconds grace) {
  if (stdin_fd_ >= 0) ::close(stdin_fd_), stdin_fd_ = -1;
  int code = WaitExit(grace);
  if (code < 0) {
    ::kill(pid_, SIGKILL);
    code = WaitExit(std::chrono::seconds(10));
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_), stdout_fd_ = -1;
  return code;
}

Result<std::string> RunCapture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                               const std::string& stderr_log) {
  VIPER_ASSIGN_OR_RETURN(auto child, LineChild::Start(argv, stderr_log));
  std::string out;
  for (;;) {
    auto line = child->ReadLine(timeout);
    if (line.ok()) {
      out += *line + "\n";
      continue;
    }
    if (line.status().code() == StatusCode::kTimeout) {
      child->Stop(std::chrono::milliseconds(0));
      return Status::Timeout(Joined(argv) + ": did not finish within " + std::to_string(timeout.count()) + " ms");
    }
    break;  // stdout closed
  }
  int code = child->Stop();
  if (code != 0) {
    std::string tail = out.size() > 400 ? out.substr(out.size() - 400) : out;
    return Status::Internal(Joined(argv) + " failed with exit code " + std::to_string(code) + ": " + tail +
                            (stderr_log.empty() ? "" : " (stderr in " + stderr_log + ")"));
  }
  return out;
}

Result<uint16_t> FreeTcpPort(const std::string& ip) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) return Status::InvalidArgument("not an IPv4 address: " + ip);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> draw(20000, 31999);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno("socket for a free port");
    a.sin_port = htons(static_cast<uint16_t>(draw(rng)));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    const int err = errno;
    ::close(fd);
    if (free) return ntohs(a.sin_port);
    if (err != EADDRINUSE) return Status::FromErrno("binding a free port on " + ip, err);
  }
  return Status::Unavailable("no free port on " + ip + " in 1000 draws from 20000-31999");
}

}  // namespace viper::bench
