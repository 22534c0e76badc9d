// viper_wire_baseline: the physical TCP stream baseline that Viper's network figures are compared
// against. One client streams N bytes to one server over one TCP connection, from a reused,
// pre-faulted buffer in large writes; the server reads into a reused buffer and acknowledges the
// byte count; the client times header-sent -> ack-received and prints GB/s (1e9 bytes/s).
//
//   viper_wire_baseline server   --listen ADDR:PORT [--clients K] [--land | --verify] [options]
//   viper_wire_baseline client   --connect ADDR:PORT --bytes N [--repeat R] [--json] [options]
//   viper_wire_baseline loopback --bytes N [--repeat R] [--json] [options]
//
// The server's sink decides what a stream is compared with. By default it reads into one reused
// --chunk buffer and looks at nothing: the plain wire. `--land` receives every stream into one
// buffer of the stream's size (reused across streams, pre-faulted when it grows), as any receiver
// of a whole model must. `--verify` also hashes each piece (xxh3-64, Viper's checksum) right after
// its recv(), while it is still in cache, and acks after the digest: the physical ceiling of a
// verified receive, which is what Viper does with every version.
//
// Socket options as Viper sets its own sockets (the default congestion control halves loopback
// throughput on these machines): TCP_CONGESTION=cubic, TCP_NODELAY, 4 MiB SO_SNDBUF and
// SO_RCVBUF (the kernel doubles the request and caps it at 2 * net.core.[rw]mem_max). `--cc default`
// and `--sockbuf 0` keep the system's choice, to measure what those settings are worth.
//
// Wire protocol (both directions little-endian): client sends "VPRWIRE1" + u64 byte count, then the
// bytes; the server answers "VPRWACK1" + u64 bytes received. A peer that sends anything else gets
// dropped with a clear error.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/fd.h"
#include "viper/snapshot.h"
#include "viper/status.h"
#include "viper/units.h"

namespace {

using viper::Fd;
using viper::Result;
using viper::Status;

constexpr char kHelloMagic[8] = {'V', 'P', 'R', 'W', 'I', 'R', 'E', '1'};
constexpr char kAckMagic[8] = {'V', 'P', 'R', 'W', 'A', 'C', 'K', '1'};
constexpr uint64_t kMaxBytes = uint64_t{1} << 40;  // 1 TiB: a sanity bound on --bytes
constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Options {
  std::string cc = "cubic";        // congestion control name, or "default" to keep the system's
  uint64_t sockbuf = 4 * kMiB;     // SO_SNDBUF/SO_RCVBUF request; 0 keeps kernel autotuning
  uint64_t chunk = 4 * kMiB;       // size of one write()/read() and of the reused buffer
  int timeout_s = 60;              // per socket operation and for accept(); 0 = wait forever
  int warmup = 0;                  // untimed streams before the timed ones (client, loopback)
  bool json = false;
  bool land = false;               // server: land each stream whole in one buffer (see the header)
  bool verify = false;             // server: and hash it as it arrives (implies land)
};

// ---------------------------------------------------------------------------------------------
// Parsing of untrusted command-line values.

// "123", "64M" / "1.7G" (decimal: k M G T) or "4Mi" (binary: Ki Mi Gi Ti): viper/units.h, at
// most kMaxBytes.
Result<uint64_t> ParseBytes(std::string_view text) {
  VIPER_ASSIGN_OR_RETURN(uint64_t bytes, viper::ParseBytes(text));
  if (bytes > kMaxBytes) return Status::InvalidArgument("byte count '" + std::string(text) + "' exceeds the limit of 1 TiB");
  return bytes;
}

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string text;  // as the user wrote it, for messages
};

// "10.77.0.1:5000", "[::1]:5000". Numeric addresses only: this tool never resolves names.
Result<Endpoint> ParseEndpoint(std::string_view text, bool allow_port_zero) {
  std::string s(text);
  std::string host;
  std::string port;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return Status::InvalidArgument("address '" + s + "': expected [IPv6]:PORT");
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return Status::InvalidArgument("address '" + s + "': expected ADDR:PORT, e.g. 10.77.0.1:5000");
    }
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  char* end = nullptr;
  long port_number = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || port_number < 0 || port_number > 65535 ||
      (port_number == 0 && !allow_port_zero)) {
    return Status::InvalidArgument("address '" + s + "': port '" + port + "' is not in " +
                                   (allow_port_zero ? "0..65535" : "1..65535"));
  }
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &info);
  if (rc != 0) {
    return Status::InvalidArgument("address '" + s + "': '" + host +
                                   "' is not a numeric IPv4/IPv6 address: " + gai_strerror(rc));
  }
  Endpoint ep;
  std::memcpy(&ep.addr, info->ai_addr, info->ai_addrlen);
  ep.len = info->ai_addrlen;
  ep.text = s;
  freeaddrinfo(info);
  return ep;
}

std::string EndpointToString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  port = ntohs(a->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

// ---------------------------------------------------------------------------------------------
// Sockets.

Status SetIntOption(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof value) != 0) {
    return Status::FromErrno(std::string("setsockopt ") + what + "=" + std::to_string(value));
  }
  return Status::OK();
}

Status SetTimeouts(int fd, int timeout_s) {
  timeval tv{timeout_s, 0};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    return Status::FromErrno("setsockopt SO_RCVTIMEO/SO_SNDTIMEO");
  }
  return Status::OK();
}

// Buffers are set before listen()/connect() so that the TCP window scale is negotiated for them.
Status ApplySocketOptions(int fd, const Options& opt) {
  if (opt.cc != "default" &&
      setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, opt.cc.data(), opt.cc.size()) != 0) {
    return Status::FromErrno("setsockopt TCP_CONGESTION=" + opt.cc +
                             " (see /proc/sys/net/ipv4/tcp_available_congestion_control)");
  }
  VIPER_RETURN_IF_ERROR(SetIntOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
  if (opt.sockbuf > 0) {
    int size = static_cast<int>(opt.sockbuf);
    VIPER_RETURN_IF_ERROR(SetIntOption(fd, SOL_SOCKET, SO_SNDBUF, size, "SO_SNDBUF"));
    VIPER_RETURN_IF_ERROR(SetIntOption(fd, SOL_SOCKET, SO_RCVBUF, size, "SO_RCVBUF"));
  }
  if (opt.timeout_s > 0) VIPER_RETURN_IF_ERROR(SetTimeouts(fd, opt.timeout_s));
  return Status::OK();
}

// What the kernel actually granted, for the report.
struct SocketFacts {
  std::string cc;
  int sndbuf = 0;
  int rcvbuf = 0;
};

SocketFacts QuerySocket(int fd) {
  SocketFacts facts;
  char name[32] = {};
  socklen_t len = sizeof name;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0) facts.cc = name;
  len = sizeof facts.sndbuf;
  getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &facts.sndbuf, &len);
  len = sizeof facts.rcvbuf;
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &facts.rcvbuf, &len);
  return facts;
}

Result<Fd> Listen(const Endpoint& ep, const Options& opt) {
  Fd fd(socket(ep.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno("socket for " + ep.text);
  VIPER_RETURN_IF_ERROR(SetIntOption(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  VIPER_RETURN_IF_ERROR(ApplySocketOptions(fd.get(), opt));  // inherited by accepted sockets
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0) {
    return Status::FromErrno("bind " + ep.text);
  }
  if (listen(fd.get(), 16) != 0) return Status::FromErrno("listen " + ep.text);
  return fd;
}

std::string BoundAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return EndpointToString(addr);
}

Result<Fd> Accept(int listen_fd, const Options& opt) {
  pollfd pfd{listen_fd, POLLIN, 0};
  int rc = poll(&pfd, 1, opt.timeout_s > 0 ? opt.timeout_s * 1000 : -1);
  if (rc < 0) return Status::FromErrno("poll on listening socket");
  if (rc == 0) {
    return Status::Timeout("no client connected within " + std::to_string(opt.timeout_s) +
                           " s (--timeout)");
  }
  Fd fd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno("accept");
  if (opt.timeout_s > 0) VIPER_RETURN_IF_ERROR(SetTimeouts(fd.get(), opt.timeout_s));
  return fd;
}

Result<Fd> Connect(const Endpoint& ep, const Options& opt) {
  Fd fd(socket(ep.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno("socket for " + ep.text);
  VIPER_RETURN_IF_ERROR(ApplySocketOptions(fd.get(), opt));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0) {
    return Status::FromErrno("connect to " + ep.text);
  }
  return fd;
}

Status WriteAll(int fd, const char* data, size_t size, const char* what) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(std::string("send ") + what);
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

// Reads exactly `size` bytes; a peer that closes early is an error that says how far it got.
Status ReadAll(int fd, char* data, size_t size, const char* what) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(std::string("recv ") + what);
    if (n == 0) {
      return Status::Unavailable(std::string("recv ") + what + ": peer closed the connection after " +
                                 std::to_string(done) + " of " + std::to_string(size) + " bytes");
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Buffers and the stream protocol.

// A reused buffer, pre-faulted so that no run pays for page faults (into fresh memory every copy
// drops to ~1.8 GB/s on this machine kind), as Viper's receive buffers are.
class Buffer {
 public:
  explicit Buffer(size_t size) : data_(size) {
    std::memset(data_.data(), 0x5a, data_.size());
  }
  char* data() { return data_.data(); }
  size_t size() const { return data_.size(); }

 private:
  std::vector<char> data_;
};

void EncodeFrame(const char (&magic)[8], uint64_t value, char (&out)[16]) {
  std::memcpy(out, magic, 8);
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

Result<uint64_t> DecodeFrame(const char (&magic)[8], const char (&in)[16], const char* what) {
  if (std::memcmp(in, magic, 8) != 0) {
    return Status::Corruption(std::string(what) + ": bad magic (peer is not viper_wire_baseline)");
  }
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<unsigned char>(in[8 + i])} << (8 * i);
  return value;
}

// A verifying server refuses streams larger than this rather than allocating what a header asks.
constexpr uint64_t kMaxLanding = uint64_t{16} << 30;

// Where a server puts the payload: the plain wire reads into one reused chunk (`landing` empty and
// unused); a verifying server lands the whole stream in `landing` and hashes it piece by piece.
struct Sink {
  Buffer chunk;
  bool land = false;
  bool verify = false;
  std::vector<char> landing;
  uint64_t last_digest = 0;
};

// Server side of one stream: header, N bytes into the sink, ack. Returns N.
Result<uint64_t> ServeStream(int fd, Sink& sink) {
  char header[16];
  VIPER_RETURN_IF_ERROR(ReadAll(fd, header, sizeof header, "stream header"));
  VIPER_ASSIGN_OR_RETURN(uint64_t total, DecodeFrame(kHelloMagic, header, "stream header"));
  const uint64_t limit = sink.land ? kMaxLanding : kMaxBytes;
  if (total > limit) {
    return Status::InvalidArgument("stream header announces " + std::to_string(total) + " bytes, more than the " +
                                   (sink.land ? "16 GiB limit of --land/--verify" : "1 TiB limit"));
  }
  if (sink.land && sink.landing.size() < total) {
    sink.landing.assign(total, 0x5a);  // grows once and is pre-faulted; later streams reuse it
  }
  // The hash follows the receive on its own thread, a piece behind (as a Viper consumer hashes
  // chunks while later ones arrive); receiving and hashing on one thread measured slower (600 MB
  // over loopback: 3.98 GB/s inline).
  // `landed` is how many bytes have arrived, or kAbandoned when the stream broke off.
  constexpr uint64_t kAbandoned = UINT64_MAX;
  std::atomic<uint64_t> landed{0};
  std::thread hasher;
  if (sink.verify) {
    hasher = std::thread([&sink, &landed, total] {
      viper::Checksum64Stream hash;
      uint64_t hashed = 0;
      while (hashed < total) {
        uint64_t ready = landed.load(std::memory_order_acquire);
        if (ready == kAbandoned) return;
        if (ready == hashed) {
          landed.wait(ready, std::memory_order_acquire);  // returns once the value changed
          continue;
        }
        hash.Update(std::span<const std::byte>(reinterpret_cast<const std::byte*>(sink.landing.data()) + hashed,
                                               static_cast<size_t>(ready - hashed)));
        hashed = ready;
      }
      sink.last_digest = hash.Digest();
    });
  }
  auto stop_hasher = [&](bool abandon) {
    if (!hasher.joinable()) return;
    if (abandon) {
      landed.store(kAbandoned, std::memory_order_release);
      landed.notify_all();
    }
    hasher.join();
  };
  uint64_t got = 0;
  while (got < total) {
    char* into = sink.land ? sink.landing.data() + got : sink.chunk.data();
    size_t want = static_cast<size_t>(std::min<uint64_t>(total - got, sink.chunk.size()));
    ssize_t n = ::recv(fd, into, want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      stop_hasher(/*abandon=*/true);
      if (n < 0) return Status::FromErrno("recv stream payload");
      return Status::Unavailable("client closed the connection after " + std::to_string(got) + " of " +
                                 std::to_string(total) + " bytes");
    }
    got += static_cast<uint64_t>(n);
    if (sink.verify) {
      landed.store(got, std::memory_order_release);
      landed.notify_one();
    }
  }
  stop_hasher(/*abandon=*/false);
  char ack[16];
  EncodeFrame(kAckMagic, total, ack);
  VIPER_RETURN_IF_ERROR(WriteAll(fd, ack, sizeof ack, "ack"));
  return total;
}

struct RunResult {
  double seconds = 0;
  SocketFacts facts;
};

// Client side of one stream. Times from the header write to the ack.
Result<RunResult> SendStream(const Endpoint& ep, uint64_t total, Buffer& buffer,
                             const Options& opt) {
  VIPER_ASSIGN_OR_RETURN(Fd fd, Connect(ep, opt));
  RunResult result;
  result.facts = QuerySocket(fd.get());
  char header[16];
  EncodeFrame(kHelloMagic, total, header);
  auto start = std::chrono::steady_clock::now();
  VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), header, sizeof header, "stream header"));
  for (uint64_t left = total; left > 0;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    VIPER_RETURN_IF_ERROR(WriteAll(fd.get(), buffer.data(), n, "stream payload"));
    left -= n;
  }
  char ack[16];
  VIPER_RETURN_IF_ERROR(ReadAll(fd.get(), ack, sizeof ack, "ack"));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  VIPER_ASSIGN_OR_RETURN(uint64_t acked, DecodeFrame(kAckMagic, ack, "ack"));
  if (acked != total) {
    return Status::Corruption("server acknowledged " + std::to_string(acked) + " bytes, sent " +
                              std::to_string(total));
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// Reports.

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

void PrintRuns(const char* mode, const std::string& peer, uint64_t bytes,
               const std::vector<RunResult>& runs, const Options& opt) {
  std::vector<double> rates;
  for (const RunResult& r : runs) rates.push_back(Gbps(bytes, r.seconds));
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2];
  const SocketFacts& f = runs.front().facts;
  if (opt.json) {
    std::printf("{\"mode\":\"%s\",\"peer\":\"%s\",\"bytes\":%" PRIu64 ",\"runs\":%zu,"
                "\"gbps\":%.4f,\"gbps_best\":%.4f,\"gbps_all\":[",
                mode, peer.c_str(), bytes, runs.size(), median, sorted.back());
    for (size_t i = 0; i < rates.size(); ++i) std::printf("%s%.4f", i ? "," : "", rates[i]);
    std::printf("],\"seconds\":[");
    for (size_t i = 0; i < runs.size(); ++i) std::printf("%s%.6f", i ? "," : "", runs[i].seconds);
    std::printf("],\"cc\":\"%s\",\"sndbuf\":%d,\"rcvbuf\":%d,\"chunk\":%" PRIu64 "}\n",
                f.cc.c_str(), f.sndbuf, f.rcvbuf, opt.chunk);
  } else {
    for (size_t i = 0; i < runs.size(); ++i) {
      std::printf("%s %s: run %zu: %" PRIu64 " bytes in %.4f s = %.3f GB/s\n", mode, peer.c_str(),
                  i + 1, bytes, runs[i].seconds, rates[i]);
    }
    std::printf("%s %s: %.3f GB/s median, %.3f GB/s best of %zu (cc=%s sndbuf=%d rcvbuf=%d "
                "chunk=%" PRIu64 ")\n",
                mode, peer.c_str(), median, sorted.back(), runs.size(), f.cc.c_str(), f.sndbuf,
                f.rcvbuf, opt.chunk);
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Modes.

// Serves `clients` streams one after the other (0 = until killed). Reports each on stdout.
Status ServeClients(int listen_fd, uint64_t clients, const Options& opt) {
  Sink sink{Buffer(opt.chunk), opt.land || opt.verify, opt.verify, {}, 0};
  for (uint64_t i = 0; clients == 0 || i < clients; ++i) {
    VIPER_ASSIGN_OR_RETURN(Fd fd, Accept(listen_fd, opt));
    auto start = std::chrono::steady_clock::now();
    Result<uint64_t> got = ServeStream(fd.get(), sink);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!got.ok()) return got.status().WithContext("client " + std::to_string(i + 1));
    if (!opt.json) {
      std::printf("server: client %" PRIu64 ": received %" PRIu64 " bytes in %.4f s = %.3f GB/s%s\n",
                  i + 1, *got, seconds, Gbps(*got, seconds),
                  opt.verify ? fmt::format(", xxh3 {:016x}", sink.last_digest).c_str() : "");
      std::fflush(stdout);
    }
  }
  return Status::OK();
}

Status RunServer(const std::string& listen, uint64_t clients, const Options& opt) {
  VIPER_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(listen, /*allow_port_zero=*/true));
  VIPER_ASSIGN_OR_RETURN(Fd fd, Listen(ep, opt));
  // Tests wait for this line (and read the port from it when --listen asked for port 0).
  std::printf("listening %s\n", BoundAddress(fd.get()).c_str());
  std::fflush(stdout);
  return ServeClients(fd.get(), clients, opt);
}

Status RunClient(const Endpoint& ep, uint64_t bytes, int repeat, const Options& opt,
                 const char* mode) {
  Buffer buffer(opt.chunk);
  for (int i = 0; i < opt.warmup; ++i) {
    VIPER_RETURN_IF_ERROR(SendStream(ep, bytes, buffer, opt).status().WithContext("warm-up"));
  }
  std::vector<RunResult> runs;
  for (int i = 0; i < repeat; ++i) {
    VIPER_ASSIGN_OR_RETURN(RunResult r, SendStream(ep, bytes, buffer, opt));
    runs.push_back(r);
  }
  PrintRuns(mode, ep.text, bytes, runs, opt);
  return Status::OK();
}

// Both ends in one process over 127.0.0.1: the server on a thread, the client here.
Status RunLoopback(uint64_t bytes, int repeat, Options opt) {
  VIPER_ASSIGN_OR_RETURN(Endpoint any, ParseEndpoint("127.0.0.1:0", true));
  VIPER_ASSIGN_OR_RETURN(Fd listen_fd, Listen(any, opt));
  VIPER_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(BoundAddress(listen_fd.get()), false));
  Status server_status;
  Options server_opt = opt;
  server_opt.json = true;  // keeps the server thread quiet; the client reports
  std::thread server([&] { server_status = ServeClients(listen_fd.get(), repeat + opt.warmup, server_opt); });
  Status client_status = RunClient(ep, bytes, repeat, opt, "loopback");
  if (!client_status.ok()) ::shutdown(listen_fd.get(), SHUT_RDWR);  // unblocks a waiting accept
  server.join();
  VIPER_RETURN_IF_ERROR(client_status);
  return server_status.WithContext("loopback server");
}

// ---------------------------------------------------------------------------------------------
// Command line.

void AddCommonOptions(CLI::App* app, Options& opt, std::string& sockbuf, std::string& chunk) {
  app->add_option("--cc", opt.cc, "TCP congestion control, or 'default' to keep the system's")
      ->capture_default_str();
  app->add_option("--sockbuf", sockbuf, "SO_SNDBUF/SO_RCVBUF request, 0 = kernel autotuning")
      ->capture_default_str();
  app->add_option("--chunk", chunk, "bytes per write()/read() and reused buffer size")
      ->capture_default_str();
  app->add_option("--timeout", opt.timeout_s, "seconds per socket operation and accept, 0 = none")
      ->capture_default_str()
      ->check(CLI::Range(0, 86400));
}

Status FinishOptions(Options& opt, const std::string& sockbuf, const std::string& chunk) {
  VIPER_ASSIGN_OR_RETURN(opt.sockbuf, ParseBytes(sockbuf));
  VIPER_ASSIGN_OR_RETURN(opt.chunk, ParseBytes(chunk));
  if (opt.sockbuf > (uint64_t{1} << 30)) return Status::InvalidArgument("--sockbuf exceeds 1 GiB");
  if (opt.chunk < 4096 || opt.chunk > (uint64_t{1} << 30)) {
    return Status::InvalidArgument("--chunk " + chunk + " is outside 4 KiB..1 GiB");
  }
  if (opt.cc.empty() || opt.cc.size() >= 16) {
    return Status::InvalidArgument("--cc '" + opt.cc + "' is not a congestion control name");
  }
  return Status::OK();
}

Status CheckBytes(uint64_t bytes, const std::string& text) {
  if (bytes == 0) return Status::InvalidArgument("--bytes " + text + " must be at least 1 byte");
  return Status::OK();
}

int Report(const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "viper_wire_baseline: %s\n", status.ToString().c_str());
  return status.code() == viper::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Raw TCP stream baseline (cubic, TCP_NODELAY, 4 MiB buffers) for Viper benchmarks"};
  app.require_subcommand(1);
  Options opt;
  std::string sockbuf = "4Mi", chunk = "4Mi", bytes_text, address;
  uint64_t clients = 1;
  int repeat = 1;

  CLI::App* server = app.add_subcommand("server", "accept streams and acknowledge them");
  server->add_option("--listen", address, "ADDR:PORT to listen on (port 0 = any)")->required();
  server->add_option("--clients", clients, "streams to serve before exiting, 0 = until killed")
      ->capture_default_str();
  server->add_flag("--json", opt.json, "print only the listening line (per-stream lines off)");
  server->add_flag("--land", opt.land, "receive each stream into one buffer of its size (<= 16 GiB)");
  server->add_flag("--verify", opt.verify, "--land, and xxh3 each piece as it arrives");
  AddCommonOptions(server, opt, sockbuf, chunk);

  CLI::App* client = app.add_subcommand("client", "stream --bytes to a server and time it");
  client->add_option("--connect", address, "server ADDR:PORT")->required();
  for (CLI::App* sub : {client, app.add_subcommand("loopback", "server thread + client on 127.0.0.1")}) {
    sub->add_option("--bytes", bytes_text, "bytes per stream, e.g. 600M, 1.7G, 64Mi")->required();
    sub->add_option("--repeat", repeat, "streams to time (median and best are reported)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    sub->add_option("--warmup", opt.warmup, "untimed streams first (a server counts them as clients)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100));
    sub->add_flag("--json", opt.json, "print one JSON object");
    AddCommonOptions(sub, opt, sockbuf, chunk);
  }
  CLI11_PARSE(app, argc, argv);

  Status st = FinishOptions(opt, sockbuf, chunk);
  if (!st.ok()) return Report(st);
  if (server->parsed()) return Report(RunServer(address, clients, opt));

  Result<uint64_t> bytes = ParseBytes(bytes_text);
  if (!bytes.ok()) return Report(bytes.status().WithContext("--bytes"));
  if (!(st = CheckBytes(*bytes, bytes_text)).ok()) return Report(st);
  if (client->parsed()) {
    Result<Endpoint> ep = ParseEndpoint(address, /*allow_port_zero=*/false);
    if (!ep.ok()) return Report(ep.status().WithContext("--connect"));
    return Report(RunClient(*ep, *bytes, repeat, opt, "client"));
  }
  return Report(RunLoopback(*bytes, repeat, opt));
}
