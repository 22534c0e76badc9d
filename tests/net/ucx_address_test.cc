// The check of peers' UCX worker addresses (src/net/ucx_address.h) against real addresses of this
// machine's UCX, malformed ones, and a live listener that is sent them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap.h"
#include "net/engine_fixture.h"
#include "ucx_address.h"

namespace viper::net::testing {
namespace {

using detail::CheckUcxWorkerAddress;
using detail::ParseUcxWorkerAddress;

// A UCX worker made with the given UCX_* settings (as Viper's engine makes them: tag, AM and
// wakeup features), alive until destroyed: its address reaches it meanwhile.
class LiveWorker {
 public:
  explicit LiveWorker(const std::vector<std::pair<std::string, std::string>>& env = {}) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    for (const auto& [k, v] : env) ::unsetenv(k.c_str());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &wparams, &worker_), UCS_OK);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    EXPECT_EQ(ucp_worker_get_address(worker_, &address, &length), UCS_OK);
    const auto* first = reinterpret_cast<const std::byte*>(address);
    address_.assign(first, first + length);
    ucp_worker_release_address(worker_, address);
  }
  ~LiveWorker() {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  LiveWorker(const LiveWorker&) = delete;
  LiveWorker& operator=(const LiveWorker&) = delete;
  const std::vector<std::byte>& address() const { return address_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;
};

// The worker address of a UCX worker made with the given UCX_* settings.
std::vector<std::byte> RealAddress(const std::vector<std::pair<std::string, std::string>>& env) {
  return LiveWorker(env).address();
}

struct Flavour {
  const char* name;
  std::vector<std::pair<std::string, std::string>> env;
};
const std::vector<Flavour>& Flavours() {
  static const std::vector<Flavour> flavours = {
      {"default", {}},
      {"address v2", {{"UCX_ADDRESS_VERSION", "v2"}}},
      {"tcp only", {{"UCX_TLS", "tcp"}}},
      {"tcp only, v2", {{"UCX_TLS", "tcp"}, {"UCX_ADDRESS_VERSION", "v2"}}},
  };
  return flavours;
}

TEST(UcxAddress, RealAddressesOfThisUcxPass) {
  for (const auto& f : Flavours()) {
    auto address = RealAddress(f.env);
    auto parsed = ParseUcxWorkerAddress(address);
    ASSERT_TRUE(parsed.ok()) << f.name << ": " << parsed.status().ToString();
    EXPECT_GT(parsed->interfaces.size(), 0u) << f.name;
    EXPECT_TRUE(CheckUcxWorkerAddress(address, address).ok()) << f.name;
    std::printf("%s: %zu bytes, v%d, %zu devices, %zu interfaces\n", f.name, address.size(), parsed->version,
                parsed->devices, parsed->interfaces.size());
  }
  // Peers with other settings still talk to each other.
  auto v1 = RealAddress({}), v2 = RealAddress({{"UCX_ADDRESS_VERSION", "v2"}});
  EXPECT_TRUE(CheckUcxWorkerAddress(v1, v2).ok());
  EXPECT_TRUE(CheckUcxWorkerAddress(v2, v1).ok());
}

// Every prefix and every single-byte change of real addresses: refused with a message, or (for a
// change that keeps the structure) accepted; never a read past the end (ASan runs this too).
TEST(UcxAddress, TruncatedOrChangedAddressesNeverReadPastTheirEnd) {
  size_t tried = 0, refused = 0;
  for (const auto& f : Flavours()) {
    auto address = RealAddress(f.env);
    for (size_t n = 0; n < address.size(); ++n) {
      std::vector<std::byte> prefix(address.begin(), address.begin() + static_cast<long>(n));  // exact size: ASan sees overreads
      auto parsed = ParseUcxWorkerAddress(prefix);
      EXPECT_FALSE(parsed.ok()) << f.name << ": a " << n << "-byte prefix was accepted";
      ++tried, ++refused;
    }
    auto longer = address;
    longer.push_back(std::byte{0});
    EXPECT_FALSE(ParseUcxWorkerAddress(longer).ok()) << f.name << ": a trailing byte was accepted";
    for (size_t at = 0; at < address.size(); ++at) {
      for (int value = 0; value < 256; ++value) {
        auto changed = address;
        changed[at] = static_cast<std::byte>(value);
        ++tried;
        if (!ParseUcxWorkerAddress(changed).ok()) ++refused;
      }
    }
  }
  std::printf("%zu malformed addresses tried, %zu refused (the rest keep a valid structure)\n", tried, refused);
}

TEST(UcxAddress, WhatUcxAbortsOnOrCannotReadSafelyIsRefused) {
  auto address = RealAddress({});
  auto expect_refused = [](std::vector<std::byte> bytes, const std::string& why, const std::string& what) {
    auto parsed = ParseUcxWorkerAddress(bytes);
    ASSERT_FALSE(parsed.ok()) << what;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos) << what << ": " << parsed.status().ToString();
  };
  auto v5 = address;
  v5[0] = static_cast<std::byte>((static_cast<uint8_t>(v5[0]) & 0xf0) | 5);  // UCX: "addr version 5", abort
  expect_refused(v5, "address version 5", "unknown version");
  auto debug = address;
  debug[0] |= std::byte{0x10};  // v1 flags live in bits 4-7: debug info
  expect_refused(debug, "worker name", "debug info");
  EXPECT_FALSE(ParseUcxWorkerAddress({}).ok());
  std::vector<std::byte> lone_header{std::byte{0x20}};
  expect_refused(lone_header, "runs past the end", "header only");
  // A known transport with an interface address of another length than this worker's.
  auto parsed = ParseUcxWorkerAddress(address);
  ASSERT_TRUE(parsed.ok());
  std::vector<std::byte> same_size = address;
  ASSERT_TRUE(CheckUcxWorkerAddress(same_size, address).ok());
}

// When this binary runs with VIPER_TEST_UCX_ADDRESS_FD set (AddressInOwnPidNamespace below), it
// writes a fresh worker address to that fd and exits, before main: UCX caches the namespaces it
// sees once per process, so only a new program shows what UCX does inside a new one.
const bool kWritesAddressAndExits = [] {
  const char* fd = std::getenv("VIPER_TEST_UCX_ADDRESS_FD");
  if (fd == nullptr) return false;
  auto address = RealAddress({});
  const bool sent = ::write(std::atoi(fd), address.data(), address.size()) == static_cast<ssize_t>(address.size());
  ::_exit(::getpid() == 1 && sent ? 0 : 11);  // pid 1: it runs in the namespace made for it
}();

// The worker address UCX makes in a process of a pid namespace of its own (a container): a child
// unshares the namespace and its child, the namespace's first process, runs this binary again to
// make the address, sent back through a pipe. nullopt (and `why`) where namespaces cannot be made.
std::optional<std::vector<std::byte>> AddressInOwnPidNamespace(std::string* why) {
  int fds[2];
  if (::pipe(fds) != 0) return *why = std::string("pipe: ") + std::strerror(errno), std::nullopt;
  pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    if (::unshare(CLONE_NEWPID) != 0) ::_exit(10);
    pid_t inner = ::fork();
    if (inner == 0) {
      ::setenv("VIPER_TEST_UCX_ADDRESS_FD", std::to_string(fds[1]).c_str(), 1);
      char* argv[] = {const_cast<char*>("viper_net_ucx_address_test"), nullptr};
      ::execv("/proc/self/exe", argv);
      ::_exit(12);
    }
    int status = 0;
    ::waitpid(inner, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 13);
  }
  ::close(fds[1]);
  std::vector<std::byte> address;
  std::byte buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) address.insert(address.end(), buffer, buffer + n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
  if (code == 10) return *why = "unshare(CLONE_NEWPID) is not permitted here (needs root or CAP_SYS_ADMIN)", std::nullopt;
  if (code != 0) return *why = "the process in the new pid namespace failed (exit " + std::to_string(code) + ")", std::nullopt;
  return address;
}

// A process in a container (a pid namespace of its own) and one outside both connect: UCX's posix
// transport adds the namespace to its interface address there, 8 bytes more than outside. Either
// side's check took the other's length for a malformed address and refused the connection.
TEST(UcxAddress, APeerInAPidNamespaceOfItsOwnPasses) {
  if (::geteuid() != 0) GTEST_SKIP() << "making a pid namespace needs root (CI runs as root)";
  std::string why;
  auto contained = AddressInOwnPidNamespace(&why);
  ASSERT_TRUE(contained.has_value()) << why;
  auto here = RealAddress({});
  auto parsed_contained = ParseUcxWorkerAddress(*contained), parsed_here = ParseUcxWorkerAddress(here);
  ASSERT_TRUE(parsed_contained.ok()) << parsed_contained.status().ToString();
  ASSERT_TRUE(parsed_here.ok()) << parsed_here.status().ToString();
  // posix and cma (UCX's name checksums) carry the namespace there.
  const std::vector<std::pair<const char*, uint16_t>> namespaced = {{"posix", 0xd3a7}, {"cma", 0x8b47}};
  for (const auto& [name, transport] : namespaced) {
    size_t here_bytes = 0, contained_bytes = 0;
    for (const auto& i : parsed_here->interfaces) if (i.transport == transport) here_bytes = i.interface_address_bytes;
    for (const auto& i : parsed_contained->interfaces) if (i.transport == transport) contained_bytes = i.interface_address_bytes;
    std::printf("%s interface address: %zu bytes here, %zu in the pid namespace\n", name, here_bytes, contained_bytes);
    EXPECT_GT(here_bytes, 0u) << "this UCX has no " << name << " transport: the case is not exercised";
    EXPECT_GT(contained_bytes, here_bytes) << name;
  }
  EXPECT_TRUE(CheckUcxWorkerAddress(*contained, here).ok()) << CheckUcxWorkerAddress(*contained, here).ToString();
  EXPECT_TRUE(CheckUcxWorkerAddress(here, *contained).ok()) << CheckUcxWorkerAddress(here, *contained).ToString();
  // What UCX reads still bounds the length: an address of this host whose flag says a namespace
  // follows, without the bytes UCX would then read, is refused.
  const std::vector<std::pair<uint16_t, size_t>> flag_byte = {{0xd3a7, 7}, {0x8b47, 3}};  // bits 60 and 31
  for (const auto& [transport, at] : flag_byte) {
    for (const auto& i : parsed_here->interfaces) {
      if (i.transport != transport) continue;
      auto flagged = here;
      flagged[i.interface_address_offset + at] |= static_cast<std::byte>(at == 7 ? 0x10 : 0x80);
      auto refused = CheckUcxWorkerAddress(flagged, here);
      EXPECT_FALSE(refused.ok()) << "transport 0x" << std::hex << transport;
      EXPECT_NE(refused.message().find("UCX reads 16 bytes"), std::string::npos) << refused.ToString();
    }
  }
}

// The token comparison runs over the whole expected token whatever the presented one holds (no
// early exit on the first difference); here, that it is right.
TEST(Tokens, EqualOnlyWhenTheWholeTokenMatches) {
  EXPECT_TRUE(TokensEqual("s3cret", "s3cret"));
  EXPECT_TRUE(TokensEqual("", ""));
  EXPECT_FALSE(TokensEqual("s3cre", "s3cret"));
  EXPECT_FALSE(TokensEqual("s3crett", "s3cret"));
  EXPECT_FALSE(TokensEqual("", "s3cret"));
  EXPECT_FALSE(TokensEqual("x", ""));
  EXPECT_FALSE(TokensEqual("s3creT", "s3cret"));
  EXPECT_FALSE(TokensEqual(std::string("s3cret\0", 7), "s3cret"));
  EXPECT_FALSE(TokensEqual(std::string("\xff" "3cret", 6), "s3cret"));
}

// A client that runs the bootstrap handshake (no token) by hand and offers `address` as its
// worker address; reports what the listener did: "accepted", "refused: <text>", "closed", "reset".
std::string RawHandshake(uint16_t port, const std::vector<std::byte>& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return ::close(fd), "no connection";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  auto read_frame = [&]() -> std::optional<detail::BootstrapFrame> {
    std::vector<std::byte> head(detail::kBootstrapHeader);
    if (::recv(fd, head.data(), head.size(), MSG_WAITALL) != static_cast<ssize_t>(head.size())) return std::nullopt;
    auto size = detail::BootstrapFrameSize(head);
    if (!size.ok()) return std::nullopt;
    head.resize(*size);
    size_t body = *size - detail::kBootstrapHeader;
    if (body > 0 && ::recv(fd, head.data() + detail::kBootstrapHeader, body, MSG_WAITALL) != static_cast<ssize_t>(body))
      return std::nullopt;
    auto f = detail::ParseBootstrapFrame(head);
    return f.ok() ? std::optional(*f) : std::nullopt;
  };
  auto hello = detail::EncodeHello({});
  (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
  auto challenge = read_frame();
  if (!challenge || challenge->type != detail::FrameType::kChallenge) return ::close(fd), "no challenge";
  detail::Proof proof;
  proof.client_address = address;
  auto frame = detail::EncodeProof(proof);
  (void)::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
  auto result = read_frame();
  int err = errno;
  ::close(fd);
  if (!result) return err == ECONNRESET ? "reset" : "closed";
  auto r = detail::DecodeResult(*result);
  if (!r.ok()) return "bad result";
  return r->code == detail::ResultCode::kAccepted ? "accepted" : "refused: " + r->text;
}

// The abort docs/ARCHITECTURE.md describes: a well-framed bootstrap frame whose worker address
// UCX cannot unpack. The listener (no token) refuses each such client (telling it why) and keeps
// serving.
TEST_F(EngineTest, MalformedWorkerAddressesAreDroppedBeforeUcxUnpacksThem) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto server = StartEngine(options);
  ASSERT_TRUE(server);
  const std::string listen = server->listen_address();
  const uint16_t port = static_cast<uint16_t>(std::stoi(listen.substr(listen.rfind(':') + 1)));
  auto address = RealAddress({});
  std::vector<std::pair<std::string, std::vector<std::byte>>> bad;
  auto v5 = address;
  v5[0] = static_cast<std::byte>((static_cast<uint8_t>(v5[0]) & 0xf0) | 5);
  bad.push_back({"address version 5 (UCX asserts)", v5});
  bad.push_back({"truncated address", std::vector<std::byte>(address.begin(), address.begin() + 20)});
  auto garbage = std::vector<std::byte>(64, std::byte{0x41});
  bad.push_back({"64 bytes of 'A'", garbage});
  for (const auto& [what, bytes] : bad) {
    std::string answer = RawHandshake(port, bytes);
    EXPECT_TRUE(answer.starts_with("refused: ")) << what << ": " << answer;
  }
  EXPECT_EQ(server->stats().peers, 0u);
  auto client = StartEngine();
  Result<PeerId> peer = client->Connect(listen);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(client->Send(*peer, AsBytes("still serving")).ok());
  EXPECT_EQ(NextText(), "still serving");
}


// A host name may resolve to addresses the node does not listen on (localhost: 127.0.0.1 and
// ::1, the node on one of them): the client tries each in turn and bootstraps with the first
// that takes the connection. Here 127.0.0.2 (loopback, where nothing listens on the port) comes
// first; before, the client tried only the first address a name resolved to.
TEST_F(EngineTest, TheClientTriesEachAddressANameResolvesTo) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto engine = StartEngine(options);
  ASSERT_TRUE(engine);
  auto port = ParseHostPort(engine->listen_address());
  ASSERT_TRUE(port.ok());
  auto refused = detail::Resolve("127.0.0.2", port->second), listening = detail::Resolve("127.0.0.1", port->second);
  ASSERT_TRUE(refused.ok() && listening.ok());
  LiveWorker client;  // the node makes an endpoint to its address
  const auto& ours = client.address();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<detail::SockAddr> both = {*refused, *listening};
  auto node_address = detail::ExchangeWorkerAddresses(both, "", ours, deadline, "connect");
  ASSERT_TRUE(node_address.ok()) << node_address.status().ToString();
  EXPECT_TRUE(ParseUcxWorkerAddress(*node_address).ok());
  std::vector<detail::SockAddr> only_refused = {*refused};
  auto none = detail::ExchangeWorkerAddresses(only_refused, "", ours, deadline, "connect");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("refused"), std::string::npos) << none.status().ToString();
  auto all = detail::ResolveAll("localhost", 7);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->front().storage.ss_family, AF_INET);  // IPv4 first, as UCX orders them
}

}  // namespace
}  // namespace viper::net::testing
