#include "bootstrap.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/fd.h"
#include "net/engine.h"
#include "viper/log.h"

namespace viper::net::detail {
namespace {

constexpr const char* kLog = "net";
constexpr char kMagic[4] = {'V', 'I', 'P', 'B'};
constexpr std::string_view kNodeLabel = "viper-bootstrap-v3 node";
constexpr std::string_view kClientLabel = "viper-bootstrap-v3 client";
constexpr std::string_view kAddressLabel = "viper-bootstrap-v3 address";
using SteadyClock = std::chrono::steady_clock;

uint32_t LoadLe(const std::byte* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}
void StoreLe(std::byte* p, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
void AppendLe32(std::vector<std::byte>& out, uint32_t v) {
  size_t at = out.size();
  out.resize(at + 4);
  StoreLe(out.data() + at, v, 4);
}
void Append(std::vector<std::byte>& out, std::span<const std::byte> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); }

// Largest body each type may carry (the header check refuses more before anything is read).
uint32_t MaxBody(FrameType type) {
  switch (type) {
    case FrameType::kHello: return kNonceSize;
    case FrameType::kChallenge: return kNonceSize + crypto::kMacSize;
    case FrameType::kProof: return crypto::kMacSize + kMaxWorkerAddress;
    case FrameType::kResult: return 1 + crypto::kMacSize + kMaxWorkerAddress;  // an accepted one
  }
  return 0;
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
      return Status::Unavailable(what + ": closed without an answer (not a Viper node, or it is this engine's own listener)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      VIPER_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
      continue;
    }
    return Status::FromErrno(what + ": recv");
  }
  return Status::OK();
}

Result<BootstrapFrame> ReadFrame(int fd, SteadyClock::time_point deadline, const std::string& what) {
  std::vector<std::byte> frame(kBootstrapHeader);
  VIPER_RETURN_IF_ERROR(ReadExact(fd, frame.data(), kBootstrapHeader, deadline, what));
  Result<size_t> size = BootstrapFrameSize(frame);
  if (!size.ok()) return size.status().WithContext(what);
  frame.resize(*size);
  VIPER_RETURN_IF_ERROR(ReadExact(fd, frame.data() + kBootstrapHeader, *size - kBootstrapHeader, deadline, what));
  Result<BootstrapFrame> parsed = ParseBootstrapFrame(frame);
  if (!parsed.ok()) return parsed.status().WithContext(what);
  return parsed;
}

Status RefusalStatus(const BootstrapResult& r, const std::string& what, const std::string& node) {
  std::string text = fmt::format("{}: refused by {}: {}", what, node, ResultCodeText(r.code));
  if (!r.text.empty()) text += " (" + r.text + ")";
  if (r.code == ResultCode::kTokenRequired || r.code == ResultCode::kWrongToken) return Status::PermissionDenied(text);
  return Status::Unavailable(text);
}

// label | nonce_c | nonce_n, then each address as u32 length | bytes.
std::vector<std::byte> ProofMessage(std::string_view label, const Nonce& client_nonce, const Nonce& node_nonce,
                                    std::initializer_list<std::span<const std::byte>> addresses = {}) {
  std::vector<std::byte> m;
  m.reserve(label.size() + 2 * kNonceSize + 1024);
  Append(m, std::as_bytes(std::span(label.data(), label.size())));
  Append(m, client_nonce);
  Append(m, node_nonce);
  for (std::span<const std::byte> address : addresses) {
    AppendLe32(m, static_cast<uint32_t>(address.size()));
    Append(m, address);
  }
  return m;
}

BootstrapResult Refusal(ResultCode code, std::string text) {
  BootstrapResult r;
  r.code = code;
  r.text = std::move(text);
  return r;
}

std::span<const std::byte> TokenBytes(std::string_view token) { return std::as_bytes(std::span(token.data(), token.size())); }

}  // namespace

std::string_view ResultCodeText(ResultCode code) {
  switch (code) {
    case ResultCode::kAccepted: return "accepted";
    case ResultCode::kTokenRequired: return "a token is required";
    case ResultCode::kWrongToken: return "wrong token";
    case ResultCode::kBusy: return "too many pending connections";
    case ResultCode::kRejected: return "rejected";
  }
  return "unknown reason";
}

std::vector<std::byte> EncodeBootstrapFrame(FrameType type, uint8_t flags, std::span<const std::byte> body) {
  std::vector<std::byte> frame(kBootstrapHeader);
  std::memcpy(frame.data(), kMagic, 4);
  StoreLe(frame.data() + 4, kBootstrapVersion, 2);
  frame[6] = static_cast<std::byte>(type);
  frame[7] = static_cast<std::byte>(flags);
  StoreLe(frame.data() + 8, static_cast<uint32_t>(body.size()), 4);
  Append(frame, body);
  return frame;
}

Result<size_t> BootstrapFrameSize(std::span<const std::byte> head) {
  if (head.size() < kBootstrapHeader) return Status::InvalidArgument("bootstrap frame: header truncated");
  if (std::memcmp(head.data(), kMagic, 4) != 0) return Status::InvalidArgument("bootstrap frame: not a Viper peer (bad magic)");
  uint32_t version = LoadLe(head.data() + 4, 2);
  if (version != kBootstrapVersion)
    return Status::InvalidArgument(
        fmt::format("bootstrap frame: version {} (this side speaks {}; upgrade the older side)", version, kBootstrapVersion));
  const auto type = static_cast<uint8_t>(head[6]);
  if (type < 1 || type > 4) return Status::InvalidArgument(fmt::format("bootstrap frame: unknown type {}", type));
  const auto flags = static_cast<uint8_t>(head[7]);
  if ((flags & ~kHasToken) != 0)
    return Status::InvalidArgument(fmt::format("bootstrap frame: unknown flags 0x{:02x}", flags));
  uint32_t length = LoadLe(head.data() + 8, 4);
  if (length > MaxBody(static_cast<FrameType>(type)))
    return Status::InvalidArgument(
        fmt::format("bootstrap frame: body length {} over {} for its type", length, MaxBody(static_cast<FrameType>(type))));
  return kBootstrapHeader + length;
}

Result<BootstrapFrame> ParseBootstrapFrame(std::span<const std::byte> frame) {
  VIPER_ASSIGN_OR_RETURN(size_t size, BootstrapFrameSize(frame));
  if (frame.size() != size)
    return Status::InvalidArgument(fmt::format("bootstrap frame: {} bytes, its header says {}", frame.size(), size));
  BootstrapFrame out;
  out.type = static_cast<FrameType>(frame[6]);
  out.flags = static_cast<uint8_t>(frame[7]);
  out.body.assign(frame.begin() + kBootstrapHeader, frame.end());
  return out;
}

std::vector<std::byte> EncodeHello(const Hello& m) {
  return EncodeBootstrapFrame(FrameType::kHello, m.has_token ? kHasToken : 0, m.nonce);
}

std::vector<std::byte> EncodeChallenge(const Challenge& m) {
  std::vector<std::byte> body(m.nonce.begin(), m.nonce.end());
  if (m.proof) Append(body, *m.proof);
  return EncodeBootstrapFrame(FrameType::kChallenge, m.proof ? kHasToken : 0, body);
}

std::vector<std::byte> EncodeProof(const Proof& m) {
  std::vector<std::byte> body;
  if (m.proof) Append(body, *m.proof);
  Append(body, m.client_address);
  return EncodeBootstrapFrame(FrameType::kProof, m.proof ? kHasToken : 0, body);
}

std::vector<std::byte> EncodeResult(const BootstrapResult& m) {
  std::vector<std::byte> body{static_cast<std::byte>(m.code)};
  if (m.code == ResultCode::kAccepted) {
    if (m.address_proof) Append(body, *m.address_proof);
    Append(body, m.node_address);
    return EncodeBootstrapFrame(FrameType::kResult, m.address_proof ? kHasToken : 0, body);
  }
  std::string_view text = std::string_view(m.text).substr(0, kMaxResultText);
  Append(body, std::as_bytes(std::span(text.data(), text.size())));
  return EncodeBootstrapFrame(FrameType::kResult, 0, body);
}

namespace {
Status WrongType(const BootstrapFrame& f, FrameType want) {
  return Status::InvalidArgument(fmt::format("bootstrap frame: type {} where {} was expected", static_cast<int>(f.type),
                                             static_cast<int>(want)));
}
Result<std::vector<std::byte>> WorkerAddress(std::span<const std::byte> bytes) {
  if (bytes.empty() || bytes.size() > kMaxWorkerAddress)
    return Status::InvalidArgument(
        fmt::format("bootstrap frame: worker address length {} outside 1..{}", bytes.size(), kMaxWorkerAddress));
  return std::vector<std::byte>(bytes.begin(), bytes.end());
}
}  // namespace

Result<Hello> DecodeHello(const BootstrapFrame& f) {
  if (f.type != FrameType::kHello) return WrongType(f, FrameType::kHello);
  if (f.body.size() != kNonceSize)
    return Status::InvalidArgument(fmt::format("bootstrap HELLO: body of {} bytes, not a {}-byte nonce", f.body.size(), kNonceSize));
  Hello m;
  std::copy(f.body.begin(), f.body.end(), m.nonce.begin());
  m.has_token = (f.flags & kHasToken) != 0;
  return m;
}

Result<Challenge> DecodeChallenge(const BootstrapFrame& f) {
  if (f.type != FrameType::kChallenge) return WrongType(f, FrameType::kChallenge);
  const size_t proof = (f.flags & kHasToken) ? crypto::kMacSize : 0;
  if (f.body.size() != kNonceSize + proof)
    return Status::InvalidArgument(fmt::format("bootstrap CHALLENGE: body of {} bytes, not {} (nonce{})", f.body.size(),
                                               kNonceSize + proof, proof ? " and proof" : ""));
  Challenge m;
  std::copy_n(f.body.begin(), kNonceSize, m.nonce.begin());
  if (proof) {
    m.proof.emplace();
    std::copy_n(f.body.begin() + kNonceSize, crypto::kMacSize, m.proof->begin());
  }
  return m;
}

Result<Proof> DecodeProof(const BootstrapFrame& f) {
  if (f.type != FrameType::kProof) return WrongType(f, FrameType::kProof);
  const size_t proof = (f.flags & kHasToken) ? crypto::kMacSize : 0;
  if (f.body.size() < proof + 1)
    return Status::InvalidArgument(fmt::format("bootstrap PROOF: body of {} bytes is truncated", f.body.size()));
  Proof m;
  if (proof) {
    m.proof.emplace();
    std::copy_n(f.body.begin(), crypto::kMacSize, m.proof->begin());
  }
  VIPER_ASSIGN_OR_RETURN(m.client_address, WorkerAddress(std::span(f.body).subspan(proof)));
  return m;
}

Result<BootstrapResult> DecodeResult(const BootstrapFrame& f) {
  if (f.type != FrameType::kResult) return WrongType(f, FrameType::kResult);
  if (f.body.empty()) return Status::InvalidArgument("bootstrap RESULT: empty body");
  const auto code = static_cast<uint8_t>(f.body[0]);
  if (code > static_cast<uint8_t>(ResultCode::kRejected))
    return Status::InvalidArgument(fmt::format("bootstrap RESULT: unknown code {}", code));
  BootstrapResult m;
  m.code = static_cast<ResultCode>(code);
  if (m.code == ResultCode::kAccepted) {
    const size_t proof = (f.flags & kHasToken) ? crypto::kMacSize : 0;
    if (f.body.size() < 1 + proof + 1)
      return Status::InvalidArgument(fmt::format("bootstrap RESULT: accepted, but its body of {} bytes is truncated", f.body.size()));
    if (proof) {
      m.address_proof.emplace();
      std::copy_n(f.body.begin() + 1, crypto::kMacSize, m.address_proof->begin());
    }
    VIPER_ASSIGN_OR_RETURN(m.node_address, WorkerAddress(std::span(f.body).subspan(1 + proof)));
    return m;
  }
  if (f.flags != 0) return Status::InvalidArgument("bootstrap RESULT: a refusal with flags");
  if (f.body.size() > 1 + kMaxResultText)
    return Status::InvalidArgument(fmt::format("bootstrap RESULT: refusal text of {} bytes over {}", f.body.size() - 1, kMaxResultText));
  // Shown to a user: printable ASCII only, whatever the node sent.
  for (auto it = f.body.begin() + 1; it != f.body.end(); ++it) {
    const char c = static_cast<char>(*it);
    m.text.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  return m;
}

crypto::Mac NodeProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce) {
  return crypto::HmacSha256(TokenBytes(token), ProofMessage(kNodeLabel, client_nonce, node_nonce));
}

crypto::Mac ClientProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce,
                        std::span<const std::byte> client_address) {
  return crypto::HmacSha256(TokenBytes(token), ProofMessage(kClientLabel, client_nonce, node_nonce, {client_address}));
}

crypto::Mac AddressProof(std::string_view token, const Nonce& client_nonce, const Nonce& node_nonce,
                         std::span<const std::byte> client_address, std::span<const std::byte> node_address) {
  return crypto::HmacSha256(TokenBytes(token),
                            ProofMessage(kAddressLabel, client_nonce, node_nonce, {client_address, node_address}));
}

namespace {

// A TCP connection to `to`, non-blocking; Unavailable naming the errno if it is refused or fails.
Result<Fd> ConnectStream(const SockAddr& to, SteadyClock::time_point deadline, const std::string& what) {
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
  return fd;
}

}  // namespace

Result<std::vector<std::byte>> ExchangeWorkerAddresses(std::span<const SockAddr> candidates, std::string_view token,
                                                       std::span<const std::byte> ours,
                                                       SteadyClock::time_point deadline, const std::string& what) {
  // A name may resolve to addresses the node does not listen on (localhost: 127.0.0.1 and ::1):
  // the first that takes the connection is the node's. Only the TCP connection is retried; a
  // node that answers and refuses is the answer.
  Result<Fd> connected = Status::Unavailable(what + ": no address to connect to");
  size_t at = 0;
  for (; at < candidates.size(); ++at) {
    const std::string where = candidates.size() == 1 ? what : what + " (" + FormatSockAddr(candidates[at].get()) + ")";
    connected = ConnectStream(candidates[at], deadline, where);
    if (connected.ok() || connected.status().code() != StatusCode::kUnavailable) break;
  }
  if (!connected.ok()) return connected.status();
  const SockAddr& to = candidates[at];
  const std::string node = FormatSockAddr(to.get());
  Fd fd = std::move(connected).value();
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  Hello hello;
  VIPER_ASSIGN_OR_RETURN(std::vector<std::byte> nonce, crypto::RandomBytes(kNonceSize));
  std::copy(nonce.begin(), nonce.end(), hello.nonce.begin());
  hello.has_token = !token.empty();
  VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), EncodeHello(hello), deadline, what));

  // Bytes from the other side that do not parse say that no Viper node of this protocol listens
  // there (another service on the port, an older or newer Viper): Unavailable, not the caller's
  // invalid argument.
  auto not_a_node = [&](const Status& st) {
    return st.code() == StatusCode::kInvalidArgument
               ? Status::Unavailable(fmt::format("{} (no Viper node of this protocol answers at {})", st.message(), node))
               : st;
  };
  Result<BootstrapFrame> first = ReadFrame(fd.get(), deadline, what);
  if (!first.ok()) return not_a_node(first.status());
  if (first->type == FrameType::kResult) {
    Result<BootstrapResult> result = DecodeResult(*first);
    if (!result.ok()) return not_a_node(result.status().WithContext(what));
    return RefusalStatus(*result, what, node);
  }
  Result<Challenge> challenge = DecodeChallenge(*first);
  if (!challenge.ok()) return not_a_node(challenge.status().WithContext(what));
  Proof proof;
  proof.client_address.assign(ours.begin(), ours.end());
  if (!token.empty()) {
    // Nothing more leaves this side until the node proved that it holds our token.
    // Refusing, the client says why (the node logs and counts it), and sends nothing else.
    if (!challenge->proof) {
      (void)WriteAll(fd.get(), EncodeResult(Refusal(ResultCode::kTokenRequired, "")), deadline, what);
      return Status::PermissionDenied(fmt::format(
          "{}: the node at {} holds no token, so it cannot prove it belongs to this fleet (not connecting)", what, node));
    }
    crypto::Mac expected = NodeProof(token, hello.nonce, challenge->nonce);
    if (!crypto::EqualConstantTime(expected, *challenge->proof)) {
      (void)WriteAll(fd.get(), EncodeResult(Refusal(ResultCode::kWrongToken, "")), deadline, what);
      return Status::PermissionDenied(fmt::format(
          "{}: wrong token: the node at {} holds another token than this side (its proof does not match; not "
          "connecting)", what, node));
    }
    proof.proof = ClientProof(token, hello.nonce, challenge->nonce, ours);
  }
  VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), EncodeProof(proof), deadline, what));

  Result<BootstrapFrame> last = ReadFrame(fd.get(), deadline, what);
  if (!last.ok()) return not_a_node(last.status());
  Result<BootstrapResult> result = DecodeResult(*last);
  if (!result.ok()) return not_a_node(result.status().WithContext(what));
  if (result->code != ResultCode::kAccepted) return RefusalStatus(*result, what, node);
  if (!token.empty()) {
    // The address the node accepted us with, from the node that proved the token: not one that
    // anyone between the two put there.
    crypto::Mac expected = AddressProof(token, hello.nonce, challenge->nonce, ours, result->node_address);
    if (!result->address_proof || !crypto::EqualConstantTime(expected, *result->address_proof))
      return Status::PermissionDenied(fmt::format(
          "{}: the node at {} accepted this side, but its worker address does not carry the token's proof (not "
          "connecting)", what, node));
  }
  return std::move(result->node_address);
}

// ---------------------------------------------------------------- Acceptor

namespace {

// At most kBurst lines per kWindow; what is held back is summed up in the next line that goes out.
class LogLimiter {
 public:
  static constexpr int kBurst = 20;
  static constexpr std::chrono::seconds kWindow{10};

  void Warn(const std::string& line) {
    const auto now = SteadyClock::now();
    if (now - window_start_ >= kWindow) {
      if (suppressed_ > 0)
        log(LogLevel::kWarn, kLog, "{} more refused connection(s) not logged in the last {} s", suppressed_,
            std::chrono::duration_cast<std::chrono::seconds>(now - window_start_).count());
      window_start_ = now, in_window_ = 0, suppressed_ = 0;
    }
    if (in_window_ < kBurst) {
      ++in_window_;
      log(LogLevel::kWarn, kLog, "{}", line);
    } else {
      ++suppressed_;
    }
  }

 private:
  SteadyClock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t suppressed_ = 0;
};

std::string HostOf(const sockaddr* address) {
  std::string text = FormatSockAddr(address);
  auto colon = text.rfind(':');
  return colon == std::string::npos ? text : text.substr(0, colon);
}

}  // namespace

struct Acceptor::Impl {
  Fd listen_fd;
  Fd stop_fd;   // eventfd: the destructor's wake-up
  Fd epoll_fd;
  Fd reserve_fd;  // held so that an accept can still be closed when the process is out of fds
  std::string address;
  std::vector<std::byte> our_address;
  Admit admit;
  Options options;
  std::atomic<bool> stop{false};
  std::thread thread;

  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::atomic<uint64_t>& n_accepted = counters->accepted;
  std::atomic<uint64_t>& n_auth = counters->auth;
  std::atomic<uint64_t>& n_timed_out = counters->timed_out;
  std::atomic<uint64_t>& n_evicted = counters->evicted;
  std::atomic<uint64_t>& n_malformed = counters->malformed;

  enum class Stage { kHello, kProof };
  struct Pending {
    Fd fd;
    std::string peer;  // "host:port"
    std::string host;  // the per-address cap's key
    Stage stage = Stage::kHello;
    SteadyClock::time_point first_deadline, deadline;
    std::vector<std::byte> frame;  // bytes read so far
    size_t want = kBootstrapHeader;
    Nonce client_nonce{}, node_nonce{};
  };
  // Keyed by a sequence number: the first is the oldest (eviction order).
  std::map<uint64_t, Pending> pending;                     // acceptor thread only
  std::unordered_map<std::string, std::set<uint64_t>> by_host;
  uint64_t next_id = 1;
  SteadyClock::time_point next_expiry = SteadyClock::time_point::max();
  LogLimiter limiter;

  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kStopId = ~uint64_t{0};

  void Run();
  void AcceptSome();
  void Expire();
  // Reads what connection `id` sent; true when it is finished (admitted or refused).
  bool Serve(uint64_t id, Pending& p);
  // Finishes `p` before admission: counts it, logs it, optionally tells the client.
  void Refuse(Pending& p, std::atomic<uint64_t>& counter, std::string_view why,
              std::optional<BootstrapResult> answer = std::nullopt);
  void Remove(uint64_t id);
  // Non-blocking: a handshake frame is far below a fresh socket's send buffer, so a peer that
  // cannot take it at once is broken or hostile and is dropped (never waited for).
  bool SendNow(const Pending& p, const std::vector<std::byte>& frame);
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
  if (::listen(impl->listen_fd.get(), SOMAXCONN) != 0) return Status::FromErrno("listen");
  SockAddr bound;
  bound.length = sizeof(bound.storage);
  if (::getsockname(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length) != 0)
    return Status::FromErrno("getsockname");
  impl->address = FormatSockAddr(bound.get());
  impl->stop_fd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (impl->stop_fd.get() < 0) return Status::FromErrno("eventfd for the acceptor");
  impl->epoll_fd = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (impl->epoll_fd.get() < 0) return Status::FromErrno("epoll for the acceptor");
  for (auto [fd, id] : {std::pair{impl->listen_fd.get(), Impl::kListenId}, std::pair{impl->stop_fd.get(), Impl::kStopId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(impl->epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl for the acceptor");
  }
  impl->reserve_fd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // Pending connections hold descriptors: leave three quarters of the process's for the rest.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    options.max_pending = std::clamp<size_t>(options.max_pending, 1, std::max<size_t>(16, nofile.rlim_cur / 4));
  options.max_pending = std::max<size_t>(options.max_pending, 1);
  options.max_pending_per_address = std::clamp<size_t>(options.max_pending_per_address, 1, options.max_pending);
  impl->our_address = std::move(our_address);
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

std::shared_ptr<const Acceptor::Counters> Acceptor::counters() const { return impl_->counters; }

void Acceptor::Impl::Run() {
  std::vector<epoll_event> events(256);
  while (!stop.load()) {
    int timeout = next_expiry == SteadyClock::time_point::max() ? -1 : RemainingMs(next_expiry);
    int n = ::epoll_wait(epoll_fd.get(), events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      log(LogLevel::kError, kLog, "acceptor epoll_wait failed: {}", std::strerror(errno));
      return;
    }
    if (stop.load()) break;
    bool listener_ready = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kStopId) continue;
      if (id == kListenId) {
        listener_ready = true;
        continue;
      }
      auto it = pending.find(id);  // may be gone: evicted earlier in this batch
      if (it != pending.end() && Serve(id, it->second)) Remove(id);
    }
    if (SteadyClock::now() >= next_expiry) Expire();
    // Pending connections were served first; then a bounded batch of new ones, so that a burst
    // of connects cannot keep this loop from reading the clients already accepted.
    if (listener_ready) AcceptSome();
  }
  pending.clear();
  by_host.clear();
}

void Acceptor::Impl::Remove(uint64_t id) {
  auto it = pending.find(id);
  if (it == pending.end()) return;
  ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
  auto host = by_host.find(it->second.host);
  if (host != by_host.end()) {
    host->second.erase(id);
    if (host->second.empty()) by_host.erase(host);
  }
  pending.erase(it);
}

void Acceptor::Impl::Expire() {
  const auto now = SteadyClock::now();
  next_expiry = SteadyClock::time_point::max();
  std::vector<uint64_t> done;
  for (auto& [id, p] : pending) {
    const auto due = p.stage == Stage::kHello ? std::min(p.first_deadline, p.deadline) : p.deadline;
    if (due <= now) {
      Refuse(p, n_timed_out,
             p.stage == Stage::kHello
                 ? fmt::format("no HELLO within {} ms", options.first_frame_timeout.count())
                 : fmt::format("handshake not finished within {} ms", options.handshake_timeout.count()));
      done.push_back(id);
    } else {
      next_expiry = std::min(next_expiry, due);
    }
  }
  for (uint64_t id : done) Remove(id);
}

void Acceptor::Impl::AcceptSome() {
  for (int batch = 0; batch < 64; ++batch) {
    SockAddr from;
    from.length = sizeof(from.storage);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&from.storage), &from.length,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if ((err == EMFILE || err == ENFILE) && reserve_fd.get() >= 0) {
        // Out of descriptors: free the reserve to take the connection off the queue and close
        // it (the listener would stay readable and this loop spin otherwise), and make room by
        // evicting the oldest pending connection.
        reserve_fd.Close();
        int taken = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (taken >= 0) ::close(taken);
        n_evicted.fetch_add(1, std::memory_order_relaxed);
        limiter.Warn(fmt::format("refused a connection: the process is out of file descriptors ({})", std::strerror(err)));
        if (!pending.empty()) {
          Refuse(pending.begin()->second, n_evicted, "evicted: the process is out of file descriptors");
          Remove(pending.begin()->first);
        }
        reserve_fd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        continue;
      }
      log(LogLevel::kWarn, kLog, "accept failed: {}", std::strerror(err));
      return;
    }
    Pending p;
    p.fd = Fd(fd);
    p.peer = FormatSockAddr(from.get());
    p.host = HostOf(from.get());
    const auto now = SteadyClock::now();
    p.first_deadline = now + options.first_frame_timeout;
    p.deadline = now + options.handshake_timeout;
    // Room first: the oldest pending connection of this address, or of all, makes way.
    auto& mine = by_host[p.host];
    if (mine.size() >= options.max_pending_per_address) {
      const uint64_t oldest = *mine.begin();
      Refuse(pending.at(oldest), n_evicted,
             fmt::format("evicted: {} pending connections from {}", mine.size(), p.host), Refusal(ResultCode::kBusy, ""));
      Remove(oldest);
    }
    if (pending.size() >= options.max_pending) {
      const uint64_t oldest = pending.begin()->first;
      Refuse(pending.begin()->second, n_evicted, fmt::format("evicted: {} pending connections", pending.size()),
             Refusal(ResultCode::kBusy, ""));
      Remove(oldest);
    }
    const uint64_t id = next_id++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      log(LogLevel::kWarn, kLog, "acceptor: epoll_ctl for a connection from {}: {}", p.peer, std::strerror(errno));
      if (by_host[p.host].empty()) by_host.erase(p.host);
      continue;
    }
    next_expiry = std::min(next_expiry, std::min(p.first_deadline, p.deadline));
    by_host[p.host].insert(id);
    pending.emplace(id, std::move(p));
  }
}

void Acceptor::Impl::Refuse(Pending& p, std::atomic<uint64_t>& counter, std::string_view why,
                            std::optional<BootstrapResult> answer) {
  counter.fetch_add(1, std::memory_order_relaxed);
  limiter.Warn(fmt::format("refused connection from {}: {}", p.peer, why));
  if (answer) SendNow(p, EncodeResult(*answer));
}

bool Acceptor::Impl::SendNow(const Pending& p, const std::vector<std::byte>& frame) {
  ssize_t n;
  do {
    n = ::send(p.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(frame.size());
}

bool Acceptor::Impl::Serve(uint64_t id, Pending& p) {
  (void)id;
  for (;;) {
    size_t have = p.frame.size();
    p.frame.resize(p.want);
    ssize_t n = ::recv(p.fd.get(), p.frame.data() + have, p.want - have, 0);
    if (n <= 0) {
      p.frame.resize(have);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      Refuse(p, n_malformed, n == 0 ? "closed before the handshake was complete" : std::strerror(errno));
      return true;
    }
    p.frame.resize(have + static_cast<size_t>(n));
    if (p.frame.size() < p.want) continue;
    if (p.want == kBootstrapHeader) {
      Result<size_t> size = BootstrapFrameSize(p.frame);
      if (!size.ok()) {
        // A peer of another version is told so (it can print it); garbage just gets closed.
        std::optional<BootstrapResult> answer;
        if (std::memcmp(p.frame.data(), kMagic, 4) == 0) answer = Refusal(ResultCode::kRejected, size.status().message());
        Refuse(p, n_malformed, size.status().message(), answer);
        return true;
      }
      p.want = *size;
      if (p.want > kBootstrapHeader) continue;
    }
    Result<BootstrapFrame> frame = ParseBootstrapFrame(p.frame);
    p.frame.clear();
    p.want = kBootstrapHeader;
    if (!frame.ok()) {
      Refuse(p, n_malformed, frame.status().message());
      return true;
    }
    const bool need_token = !options.token.empty();
    if (p.stage == Stage::kHello) {
      Result<Hello> hello = DecodeHello(*frame);
      if (!hello.ok()) {
        Refuse(p, n_malformed, hello.status().message());
        return true;
      }
      if (need_token && !hello->has_token) {
        Refuse(p, n_auth, "it holds no token (this node requires one)", Refusal(ResultCode::kTokenRequired, ""));
        return true;
      }
      Challenge challenge;
      Result<std::vector<std::byte>> nonce = crypto::RandomBytes(kNonceSize);
      if (!nonce.ok()) {
        Refuse(p, n_malformed, nonce.status().message(), Refusal(ResultCode::kRejected, "no randomness"));
        return true;
      }
      std::copy(nonce->begin(), nonce->end(), challenge.nonce.begin());
      if (need_token) challenge.proof = NodeProof(options.token, hello->nonce, challenge.nonce);
      p.client_nonce = hello->nonce;
      p.node_nonce = challenge.nonce;
      p.stage = Stage::kProof;
      if (!SendNow(p, EncodeChallenge(challenge))) {
        Refuse(p, n_malformed, "could not send the CHALLENGE without waiting");
        return true;
      }
      continue;  // its PROOF may already be here
    }
    if (frame->type == FrameType::kResult) {  // the client refused this node's proof
      Result<BootstrapResult> why = DecodeResult(*frame);
      Refuse(p, why.ok() && why->code != ResultCode::kRejected ? n_auth : n_malformed,
             fmt::format("the client refused this node: {}", why.ok() ? ResultCodeText(why->code) : why.status().message()));
      return true;
    }
    Result<Proof> proof = DecodeProof(*frame);
    if (!proof.ok()) {
      Refuse(p, n_malformed, proof.status().message());
      return true;
    }
    if (need_token) {
      if (!proof->proof) {
        Refuse(p, n_auth, "it holds no token (this node requires one)", Refusal(ResultCode::kTokenRequired, ""));
        return true;
      }
      crypto::Mac expected = ClientProof(options.token, p.client_nonce, p.node_nonce, proof->client_address);
      if (!crypto::EqualConstantTime(expected, *proof->proof)) {
        Refuse(p, n_auth, "wrong token (its proof does not match)", Refusal(ResultCode::kWrongToken, ""));
        return true;
      }
    }
    // Only now, from a peer that proved the token (or to a node without one), does UCX see the
    // worker address (admit checks it before ucp_ep_create), and the peer see ours.
    BootstrapResult accepted;
    accepted.node_address = our_address;
    if (need_token)
      accepted.address_proof = AddressProof(options.token, p.client_nonce, p.node_nonce, proof->client_address, our_address);
    Status admitted = admit(std::move(proof->client_address), p.peer);
    if (!admitted.ok()) {
      Refuse(p, n_malformed, admitted.message(), Refusal(ResultCode::kRejected, admitted.message()));
      return true;
    }
    n_accepted.fetch_add(1, std::memory_order_relaxed);
    if (!SendNow(p, EncodeResult(accepted)))
      log(LogLevel::kWarn, kLog, "answering {}: could not send the RESULT at once; the peer will time out", p.peer);
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
