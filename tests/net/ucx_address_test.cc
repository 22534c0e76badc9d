// The check of peers' UCX worker addresses (src/net/ucx_address.h) against real addresses of this
// machine's UCX, malformed ones, and a live listener that is sent them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <cstdlib>
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

// The worker address of a UCX worker made with the given UCX_* settings (as Viper's engine makes
// them: tag, AM and wakeup features).
std::vector<std::byte> RealAddress(const std::vector<std::pair<std::string, std::string>>& env) {
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  ucp_config_t* config = nullptr;
  EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  for (const auto& [k, v] : env) ::unsetenv(k.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  EXPECT_EQ(ucp_init(&params, config, &context), UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  EXPECT_EQ(ucp_worker_create(context, &wparams, &worker), UCS_OK);
  ucp_address_t* address = nullptr;
  size_t length = 0;
  EXPECT_EQ(ucp_worker_get_address(worker, &address, &length), UCS_OK);
  const auto* first = reinterpret_cast<const std::byte*>(address);
  std::vector<std::byte> out(first, first + length);
  ucp_worker_release_address(worker, address);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return out;
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

}  // namespace
}  // namespace viper::net::testing
