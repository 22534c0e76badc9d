#include "bootstrap.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "viper/fd.h"
#include "viper/engine.h"
#include "viper/log.h"

namespace viper::net::detail {
namespace {

constexpr const char* kLog = "net";
constexpr char kMagic[4] = {'V', 'I', 'P', 'B'};
constexpr uint16_t kVersion = 1;
using SteadyClock = std::chrono::steady_clock;

uint32_t LoadLe(const std::byte* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}
void StoreLe(std::byte* p, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

int RemainingMs(SteadyClock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status WaitFd(int fd, short events, SteadyClock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return Status::OK();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(what + ": poll");
    return Status::Timeout(what + ": no answer in time");
  }
}

Status WriteAll(int fd, std::span<const std::byte> bytes, SteadyClock::time_point deadline, const std::string& what) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes = bytes.subspan(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      VIPER_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, what));
      continue;
    }
    return Status::FromErrno(what + ": send");
  }
  return Status::OK();
}

Status ReadExact(int fd, std::byte* out, size_t size, SteadyClock::time_point deadline, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::recv(fd, out, size, 0);
    if (n > 0) {
      out += n, size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      return Status::Unavailable(what + ": closed without an answer (not a Viper node, it refused us, or it is this engine's own listener)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      VIPER_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
      continue;
    }
    return Status::FromErrno(what + ": recv");
  }
  return Status::OK();
}

}  // namespace

std::vector<std::byte> EncodeBootstrapFrame(std::string_view token, std::span<const std::byte> worker_address) {
  std::vector<std::byte> frame(kBootstrapHeader + token.size() + worker_address.size());
  std::memcpy(frame.data(), kMagic, 4);
  StoreLe(frame.data() + 4, kVersion, 2);
  StoreLe(frame.data() + 6, static_cast<uint32_t>(token.size()), 2);
  StoreLe(frame.data() + 8, static_cast<uint32_t>(worker_address.size()), 4);
  if (!token.empty()) std::memcpy(frame.data() + kBootstrapHeader, token.data(), token.size());
  if (!worker_address.empty())
    std::memcpy(frame.data() + kBootstrapHeader + token.size(), worker_address.data(), worker_address.size());
  return frame;
}

Result<size_t> BootstrapFrameSize(std::span<const std::byte> head) {
  if (head.size() < kBootstrapHeader) return Status::InvalidArgument("bootstrap frame: header truncated");
  if (std::memcmp(head.data(), kMagic, 4) != 0) return Status::InvalidArgument("bootstrap frame: not a Viper peer (bad magic)");
  uint32_t version = LoadLe(head.data() + 4, 2);
  if (version != kVersion)
    return Status::InvalidArgument(fmt::format("bootstrap frame: version {} (this side speaks {})", version, kVersion));
  uint32_t token = LoadLe(head.data() + 6, 2);
  if (token > kMaxToken)
    return Status::InvalidArgument(fmt::format("bootstrap frame: token length {} over {}", token, kMaxToken));
  uint32_t length = LoadLe(head.data() + 8, 4);
  if (length == 0 || length > kMaxWorkerAddress)
    return Status::InvalidArgument(fmt::format("bootstrap frame: address length {} outside 1..{}", length, kMaxWorkerAddress));
  return kBootstrapHeader + token + length;
}

Result<BootstrapFrame> ParseBootstrapFrame(std::span<const std::byte> frame) {
  VIPER_ASSIGN_OR_RETURN(size_t size, BootstrapFrameSize(frame));
  if (frame.size() != size)
    return Status::InvalidArgument(fmt::format("bootstrap frame: {} bytes, its header says {}", frame.size(), size));
  const size_t token = LoadLe(frame.data() + 6, 2);
  BootstrapFrame out;
  out.token.assign(reinterpret_cast<const char*>(frame.data() + kBootstrapHeader), token);
  out.worker_address.assign(frame.begin() + kBootstrapHeader + token, frame.end());
  return out;
}

Result<std::vector<std::byte>> ExchangeWorkerAddresses(const SockAddr& to, std::string_view token,
                                                       std::span<const std::byte> ours,
                                                       SteadyClock::time_point deadline, const std::string& what) {
  Fd fd(::socket(to.get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return Status::FromErrno(what + ": socket");
  if (::connect(fd.get(), to.get(), to.length) != 0) {
    if (errno != EINPROGRESS) return Status::Unavailable(what + ": " + std::strerror(errno));
    VIPER_RETURN_IF_ERROR(WaitFd(fd.get(), POLLOUT, deadline, what));
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Unavailable(what + ": " + std::strerror(err));
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), EncodeBootstrapFrame(token, ours), deadline, what));
  std::vector<std::byte> frame(kBootstrapHeader);
  VIPER_RETURN_IF_ERROR(ReadExact(fd.get(), frame.data(), kBootstrapHeader, deadline, what));
  Result<size_t> size = BootstrapFrameSize(frame);
  if (!size.ok()) return size.status().WithContext(what);
  frame.resize(*size);
  VIPER_RETURN_IF_ERROR(ReadExact(fd.get(), frame.data() + kBootstrapHeader, *size - kBootstrapHeader, deadline, what));
  VIPER_ASSIGN_OR_RETURN(BootstrapFrame answer, ParseBootstrapFrame(frame));
  return std::move(answer.worker_address);
}

// ---------------------------------------------------------------- Acceptor

struct Acceptor::Impl {
  Fd listen_fd;
  Fd stop_fd;  // eventfd: the destructor's wake-up
  std::string address;
  std::vector<std::byte> our_frame;
  Admit admit;
  Options options;
  std::atomic<bool> stop{false};
  std::thread thread;

  struct Pending {
    Fd fd;
    std::string peer;
    SteadyClock::time_point deadline;
    std::vector<std::byte> frame;  // bytes read so far
    size_t want = kBootstrapHeader;
  };
  std::vector<Pending> pending;  // acceptor thread only

  void Run();
  void AcceptNew();
  // Reads what `p` sent; true when the connection is finished (served or dropped).
  bool Serve(Pending& p);
  void Drop(const Pending& p, std::string_view why) {
    log(LogLevel::kWarn, kLog, "dropped connection from {}: {}", p.peer, why);
  }
};

Result<std::unique_ptr<Acceptor>> Acceptor::Start(const SockAddr& bind_to, std::vector<std::byte> our_address,
                                                  Admit admit, Options options) {
  auto impl = std::make_unique<Impl>();
  impl->listen_fd = Fd(::socket(bind_to.get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (impl->listen_fd.get() < 0) return Status::FromErrno("listener socket");
  int one = 1;
  // A node restarted on its fixed port can listen again although old connections linger.
  ::setsockopt(impl->listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(impl->listen_fd.get(), bind_to.get(), bind_to.length) != 0) {
    if (errno == EADDRINUSE) return Status::Unavailable("address already in use");
    return Status::FromErrno("bind");
  }
  if (::listen(impl->listen_fd.get(), 128) != 0) return Status::FromErrno("listen");
  SockAddr bound;
  bound.length = sizeof(bound.storage);
  if (::getsockname(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length) != 0)
    return Status::FromErrno("getsockname");
  impl->address = FormatSockAddr(bound.get());
  impl->stop_fd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (impl->stop_fd.get() < 0) return Status::FromErrno("eventfd for the acceptor");
  impl->our_frame = EncodeBootstrapFrame("", our_address);
  impl->admit = std::move(admit);
  impl->options = options;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    pthread_setname_np(pthread_self(), "viper-accept");
    raw->Run();
  });
  return std::unique_ptr<Acceptor>(new Acceptor(std::move(impl)));
}

Acceptor::Acceptor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Acceptor::~Acceptor() {
  impl_->stop.store(true);
  uint64_t one = 1;
  while (::write(impl_->stop_fd.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
}

std::string Acceptor::address() const { return impl_->address; }
bool Acceptor::stopping() const { return impl_->stop.load(); }

void Acceptor::Impl::Run() {
  std::vector<pollfd> fds;
  while (!stop.load()) {
    fds.clear();
    fds.push_back({stop_fd.get(), POLLIN, 0});
    fds.push_back({listen_fd.get(), static_cast<short>(pending.size() < options.max_pending ? POLLIN : 0), 0});
    SteadyClock::time_point next = SteadyClock::time_point::max();
    for (const auto& p : pending) {
      fds.push_back({p.fd.get(), POLLIN, 0});
      next = std::min(next, p.deadline);
    }
    int timeout = next == SteadyClock::time_point::max() ? -1 : RemainingMs(next);
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      log(LogLevel::kError, kLog, "acceptor poll failed: {}", std::strerror(errno));
      return;
    }
    if (stop.load()) break;
    // Serve the connections polled above (new ones are appended after them).
    std::vector<bool> finished(pending.size(), false);
    for (size_t i = 0; i < pending.size() && n > 0; ++i) {
      if (fds[i + 2].revents != 0) finished[i] = Serve(pending[i]);
    }
    SteadyClock::time_point now = SteadyClock::now();
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!finished[i] && pending[i].deadline <= now) {
        Drop(pending[i], fmt::format("no valid bootstrap frame within {} ms", options.handshake_timeout.count()));
        finished[i] = true;
      }
    }
    size_t kept = 0;
    for (size_t i = 0; i < pending.size(); ++i)
      if (!finished[i]) pending[kept++] = std::move(pending[i]);
    pending.resize(kept);
    if (n > 0 && (fds[1].revents & POLLIN)) AcceptNew();
  }
  pending.clear();
}

void Acceptor::Impl::AcceptNew() {
  while (pending.size() < options.max_pending) {
    SockAddr from;
    from.length = sizeof(from.storage);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&from.storage), &from.length,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      log(LogLevel::kWarn, kLog, "accept failed: {}", std::strerror(err));
      // Out of file descriptors (EMFILE/ENFILE) leaves the connection queued and the listener
      // readable: back off instead of spinning on poll.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return;
    }
    Pending p;
    p.fd = Fd(fd);
    p.peer = FormatSockAddr(from.get());
    p.deadline = SteadyClock::now() + options.handshake_timeout;
    p.frame.reserve(kBootstrapHeader);
    pending.push_back(std::move(p));
  }
}

bool Acceptor::Impl::Serve(Pending& p) {
  for (;;) {
    size_t have = p.frame.size();
    p.frame.resize(p.want);
    ssize_t n = ::recv(p.fd.get(), p.frame.data() + have, p.want - have, 0);
    if (n <= 0) {
      p.frame.resize(have);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      Drop(p, n == 0 ? "closed before its bootstrap frame was complete" : std::strerror(errno));
      return true;
    }
    p.frame.resize(have + static_cast<size_t>(n));
    if (p.frame.size() < p.want) continue;
    if (p.want == kBootstrapHeader) {
      Result<size_t> size = BootstrapFrameSize(p.frame);
      if (!size.ok()) {
        Drop(p, size.status().message());
        return true;
      }
      p.want = *size;
      continue;
    }
    Result<BootstrapFrame> client = ParseBootstrapFrame(p.frame);
    if (!client.ok()) {
      Drop(p, client.status().message());
      return true;
    }
    if (!options.token.empty() && !net::TokensEqual(client->token, options.token)) {
      Drop(p, client->token.empty() ? "bootstrap frame carries no token (the node requires one)"
                                    : "bootstrap frame carries a wrong token");
      return true;
    }
    Status admitted = admit(std::move(client->worker_address), p.peer);
    if (!admitted.ok()) {
      Drop(p, admitted.message());
      return true;
    }
    Status sent = WriteAll(p.fd.get(), our_frame, SteadyClock::now() + options.handshake_timeout,
                           "answering " + p.peer);
    if (!sent.ok()) log(LogLevel::kWarn, kLog, "{}", sent.message());
    return true;
  }
}

}  // namespace viper::net::detail

namespace viper::net {
bool TokensEqual(std::string_view presented, std::string_view expected) {
  unsigned diff = presented.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned>(expected[i] ^ (i < presented.size() ? presented[i] : 0));
  return diff == 0;
}
}  // namespace viper::net
