// The UCX engine against real processes (viper_net_test_peer) and real UCX over loopback.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "net/net_test_util.h"
#include "viper/engine.h"

namespace viper::net::testing {
namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

struct Helper {
  ChildProcess process;
  std::string address;
};

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> StartEngine(EngineOptions options = {}) {
    auto engine = Engine::Start(options, events_.Handlers());
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  static std::optional<Helper> StartHelper(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {HelperPath(), "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::optional<ChildProcess> child = ChildProcess::Start(argv);
    if (!child) return std::nullopt;
    std::optional<std::string> address = child->WaitFor("LISTEN ", 10s);
    if (!address) return std::nullopt;
    return Helper{std::move(*child), *address};
  }
  std::string NextText(Ms timeout = 10s) {
    auto m = events_.NextMessage(timeout);
    return m ? m->text() : "<no message within timeout>";
  }

  EventLog events_;  // declared first: outlives the engines of each test
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Waits until everything queued on the progress thread before this call has run.
void Drain(Engine& engine) {
  CompletionLatch latch;
  Completion cb = latch.Callback();
  engine.Post([cb] { cb(Status::OK()); });
  ASSERT_TRUE(latch.Wait(10s).has_value());
}

TEST_F(EngineTest, ControlMessagesBothWaysIncludingTwoMegabytes) {
  auto engine = StartEngine();
  ASSERT_NE(engine, nullptr);
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  ASSERT_TRUE(engine->Send(*peer, AsBytes("hello")).ok());
  auto echo = events_.NextMessage(10s);
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->peer, *peer);
  EXPECT_EQ(echo->text(), "hello");

  std::vector<std::byte> big(2u << 20);  // rendezvous-sized: exercises ucp_am_recv_data_nbx
  FillPattern(big, 11, 0);
  Status sent = engine->SendAndWait(*peer, big);
  ASSERT_TRUE(sent.ok()) << sent.ToString();
  auto big_echo = events_.NextMessage(10s);
  ASSERT_TRUE(big_echo);
  EXPECT_TRUE(big_echo->bytes == big) << "2 MB echo differs";

  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:big 2097152 12")).ok());
  auto from_helper = events_.NextMessage(10s);
  ASSERT_TRUE(from_helper);
  ASSERT_EQ(from_helper->bytes.size(), 2097152u);
  EXPECT_EQ(FindPatternMismatch(from_helper->bytes, 12, 0), -1);

  Engine::Stats stats = engine->stats();
  EXPECT_EQ(stats.peers, 1u);
  EXPECT_EQ(stats.messages_in, 3u);
  EXPECT_EQ(stats.messages_out, 3u);
}

TEST_F(EngineTest, AcceptsAPeerThatConnectsToTheListener) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto engine = StartEngine(options);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->listen_address().rfind("127.0.0.1:", 0), 0u) << engine->listen_address();
  EXPECT_NE(engine->listen_address(), "127.0.0.1:0");
  auto child = ChildProcess::Start({HelperPath(), "--connect", engine->listen_address()});
  ASSERT_TRUE(child);
  auto accepted = events_.WaitAccepted(10s);
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->second.rfind("127.0.0.1:", 0), 0u) << accepted->second;
  auto hello = events_.NextMessage(10s);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->peer, accepted->first);
  EXPECT_EQ(hello->text(), "hello from helper");
  ASSERT_TRUE(engine->Send(accepted->first, AsBytes("cmd:hello")).ok());
  EXPECT_EQ(NextText(), "hello " + std::string(child->WaitFor("CONNECTED ", 5s).value_or("?")));
}

TEST_F(EngineTest, ThousandMessagesArriveInOrderAndPingPongLatency) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  // Every 100th message is 1 MiB (rendezvous) so eager ones overtake it inside UCX: the engine
  // must still deliver in order.
  constexpr uint64_t kCount = 1000;
  for (uint64_t i = 0; i < kCount; ++i) {
    std::vector<std::byte> msg(i % 100 == 50 ? (1u << 20) : 16);
    std::memcpy(msg.data(), &i, sizeof(i));
    ASSERT_TRUE(engine->Send(*peer, msg).ok());
  }
  for (uint64_t i = 0; i < kCount; ++i) {
    auto m = events_.NextMessage(10s);
    ASSERT_TRUE(m) << "message " << i << " missing";
    uint64_t seq = ~uint64_t{0};
    std::memcpy(&seq, m->bytes.data(), sizeof(seq));
    ASSERT_EQ(seq, i);
    ASSERT_EQ(m->bytes.size(), i % 100 == 50 ? (1u << 20) : 16u);
  }
  std::vector<double> micros;
  std::vector<std::byte> ping(64);
  for (int i = 0; i < 1000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(engine->Send(*peer, ping).ok());
    ASSERT_TRUE(events_.NextMessage(10s));
    micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(micros.begin(), micros.end());
  std::printf("control ping-pong (64 B, round trip through both engines): p50 %.1f us, p99 %.1f us, max %.1f us\n",
              micros[500], micros[990], micros.back());
}

// Posts receives for `total` bytes in `chunk`-sized tagged pieces with at most `inflight` pending.
Status ReceiveWindowed(Engine& engine, PeerId peer, uint64_t tag0, std::span<std::byte> buffer, size_t chunk,
                       int inflight) {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  Status first_error;
  size_t chunks = (buffer.size() + chunk - 1) / chunk;
  for (size_t i = 0; i < chunks; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, 30s, [&] { return i - done < static_cast<size_t>(inflight); })) {
        return Status::Timeout("bulk receive window stalled");
      }
    }
    size_t len = std::min(chunk, buffer.size() - i * chunk);
    engine.RecvBulk(peer, tag0 + i, buffer.subspan(i * chunk, len), [&](const Status& st) {
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && first_error.ok()) first_error = st;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, 60s, [&] { return done == chunks; })) return Status::Timeout("bulk receive did not finish");
  return first_error;
}

TEST_F(EngineTest, Bulk256MiBIn4MiBChunksIsBitExact) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  constexpr size_t kTotal = 256u << 20, kChunk = 4u << 20;
  std::vector<std::byte> buffer(kTotal);
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:send-bulk 1000 268435456 4194304 8 77 0")).ok());
  Status received = ReceiveWindowed(*engine, *peer, 1000, buffer, kChunk, 8);
  ASSERT_TRUE(received.ok()) << received.ToString();
  EXPECT_EQ(NextText(), "done:send-bulk ok");
  EXPECT_EQ(FindPatternMismatch(buffer, 77, 0), -1);

  // The other direction, 64 MiB: the helper verifies and reports.
  std::vector<std::byte> out(64u << 20);
  FillPattern(out, 78, 0);
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:recv-bulk 5000 67108864 4194304 8 78 0")).ok());
  std::vector<CompletionLatch> latches(16);
  for (size_t i = 0; i < 16; ++i) {
    engine->SendBulk(*peer, 5000 + i, std::span<const std::byte>(out).subspan(i * kChunk, kChunk), latches[i].Callback());
  }
  for (auto& latch : latches) {
    auto st = latch.Wait(30s);
    ASSERT_TRUE(st);
    EXPECT_TRUE(st->ok()) << st->ToString();
  }
  EXPECT_EQ(NextText(), "done:recv-bulk ok");
}

TEST_F(EngineTest, BulkSizeMismatchIsAnError) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  std::vector<std::byte> big(2u << 20), small(512u << 10);
  CompletionLatch shorter, longer;
  engine->RecvBulk(*peer, 7000, big, shorter.Callback());
  engine->RecvBulk(*peer, 7001, small, longer.Callback());
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:send-bulk 7000 2097152 1048576 2 5 0")).ok());
  auto a = shorter.Wait(10s);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->code(), StatusCode::kCorruption) << a->ToString();
  EXPECT_NE(a->message().find("got 1048576 bytes, expected 2097152"), std::string::npos) << a->ToString();
  auto b = longer.Wait(10s);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->code(), StatusCode::kInvalidArgument) << b->ToString();
  EXPECT_NE(b->message().find("larger than the 524288-byte buffer"), std::string::npos) << b->ToString();
}

TEST_F(EngineTest, KilledPeerFailsItsPendingOperationsAndOthersKeepWorking) {
  auto engine = StartEngine();
  auto victim = StartHelper();
  auto survivor = StartHelper();
  ASSERT_TRUE(victim && survivor);
  Result<PeerId> dead = engine->Connect(victim->address);
  Result<PeerId> alive = engine->Connect(survivor->address);
  ASSERT_TRUE(dead.ok() && alive.ok());

  std::vector<std::byte> in(1u << 20), out(8u << 20);
  CompletionLatch recv, send;
  engine->RecvBulk(*dead, 0xdead, in, recv.Callback());
  engine->SendBulk(*dead, 0xbeef, out, send.Callback());  // rendezvous: waits for a receive that never comes
  Drain(*engine);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(recv.Wait(0ms).has_value());

  auto killed_at = std::chrono::steady_clock::now();
  victim->process.Kill(SIGKILL);
  auto reason = events_.WaitClosed(*dead, 15s);
  ASSERT_TRUE(reason) << "on_peer_closed did not fire";
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  std::printf("peer failure noticed %.3f s after SIGKILL: %s\n", seconds, reason->ToString().c_str());
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable) << reason->ToString();

  auto r = recv.Wait(5s);
  ASSERT_TRUE(r) << "pending RecvBulk not completed";
  EXPECT_EQ(r->code(), StatusCode::kUnavailable) << r->ToString();
  auto s = send.Wait(5s);
  ASSERT_TRUE(s) << "pending SendBulk not completed";
  EXPECT_EQ(s->code(), StatusCode::kUnavailable) << s->ToString();
  EXPECT_EQ(engine->Send(*dead, AsBytes("x")).code(), StatusCode::kNotFound);

  ASSERT_TRUE(engine->Send(*alive, AsBytes("still there?")).ok());
  EXPECT_EQ(NextText(), "still there?");
  EXPECT_EQ(engine->stats().peers, 1u);
  EXPECT_EQ(recv.calls(), 1);
  EXPECT_EQ(send.calls(), 1);
}

TEST_F(EngineTest, KilledAcceptedPeerIsReported) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto engine = StartEngine(options);
  auto child = ChildProcess::Start({HelperPath(), "--connect", engine->listen_address()});
  ASSERT_TRUE(child);
  auto accepted = events_.WaitAccepted(10s);
  ASSERT_TRUE(accepted);
  EXPECT_EQ(NextText(), "hello from helper");
  std::vector<std::byte> in(4096);
  CompletionLatch recv;
  engine->RecvBulk(accepted->first, 42, in, recv.Callback());
  child->Kill(SIGKILL);
  auto reason = events_.WaitClosed(accepted->first, 15s);
  ASSERT_TRUE(reason);
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable) << reason->ToString();
  auto r = recv.Wait(5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine->stats().peers, 0u);
}

TEST_F(EngineTest, ConnectToPortWithoutListenerFailsWithinTimeout) {
  EngineOptions options;
  options.connect_timeout = 3s;
  auto engine = StartEngine(options);
  std::string address = "127.0.0.1:" + std::to_string(UnusedPort());
  auto t0 = std::chrono::steady_clock::now();
  Result<PeerId> peer = engine->Connect(address);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(peer.ok());
  std::printf("refused connect failed after %.3f s: %s\n", seconds, peer.status().ToString().c_str());
  EXPECT_TRUE(peer.status().code() == StatusCode::kUnavailable || peer.status().code() == StatusCode::kTimeout)
      << peer.status().ToString();
  EXPECT_NE(peer.status().message().find(address), std::string::npos) << peer.status().ToString();
  EXPECT_LT(seconds, 3.0 + 1.0);
  EXPECT_EQ(engine->stats().peers, 0u);
}

TEST_F(EngineTest, ConnectToSilentListenerTimesOut) {
  // A TCP socket that listens but never speaks UCX: the handshake cannot finish.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  EngineOptions options;
  options.connect_timeout = 1s;
  auto engine = StartEngine(options);
  std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto t0 = std::chrono::steady_clock::now();
  Result<PeerId> peer = engine->Connect(address);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  ASSERT_FALSE(peer.ok());
  std::printf("silent listener: failed after %.3f s: %s\n", seconds, peer.status().ToString().c_str());
  EXPECT_NE(peer.status().message().find(address), std::string::npos) << peer.status().ToString();
  EXPECT_LT(seconds, 1.0 + 1.0);
}

TEST_F(EngineTest, BadAddressesAreRejected) {
  auto engine = StartEngine();
  auto r = engine->Connect("127.0.0.1:70000");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("larger than 65535"), std::string::npos) << r.status().ToString();

  EngineOptions bad;
  bad.listen = "127.0.0.1";
  auto e = Engine::Start(bad, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();

  EngineOptions first;
  first.listen = "127.0.0.1:0";
  auto a = StartEngine(first);
  EngineOptions same;
  same.listen = a->listen_address();
  auto b = Engine::Start(same, {});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().ToString();
  EXPECT_NE(b.status().message().find(same.listen), std::string::npos) << b.status().ToString();
}

TEST_F(EngineTest, IdleCpuIsNearZeroWithAConnectedPeer) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(engine->Send(*peer, AsBytes("warm up")).ok());
  EXPECT_EQ(NextText(), "warm up");
  std::this_thread::sleep_for(200ms);  // past the spin phase
  uint64_t wakeups0 = engine->stats().wakeups;
  double self0 = ProcessCpuSeconds(), helper0 = helper->process.CpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double self = ProcessCpuSeconds() - self0, other = helper->process.CpuSeconds() - helper0;
  uint64_t wakeups = engine->stats().wakeups - wakeups0;
  std::printf("idle %.2f s with a connected peer: this process %.4f s CPU, helper %.4f s CPU, %lu wakeups\n", wall,
              self, other, static_cast<unsigned long>(wakeups));
  // "No busy-poll" as a property: a spinning progress thread would burn ~100% of a core.
  EXPECT_LT(self, 0.1 * wall);
  EXPECT_LT(other, 0.1 * wall);
}

TEST_F(EngineTest, BlockingCallsOnTheProgressThreadFail) {
  auto engine = StartEngine();
  std::optional<Status> connect, send;
  CompletionLatch latch;
  Completion cb = latch.Callback();
  engine->Post([&, cb] {
    connect = engine->Connect("127.0.0.1:1").status();
    send = engine->SendAndWait(1, AsBytes("x"));
    cb(Status::OK());
  });
  ASSERT_TRUE(latch.Wait(10s));
  EXPECT_EQ(connect->code(), StatusCode::kFailedPrecondition) << connect->ToString();
  EXPECT_EQ(send->code(), StatusCode::kFailedPrecondition) << send->ToString();
}

TEST_F(EngineTest, OperationsOnUnknownPeersFailCleanly) {
  auto engine = StartEngine();
  EXPECT_EQ(engine->Send(42, AsBytes("x")).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine->SendAndWait(42, AsBytes("x")).code(), StatusCode::kNotFound);
  std::vector<std::byte> buf(16);
  CompletionLatch send, recv;
  engine->SendBulk(42, 1, buf, send.Callback());
  engine->RecvBulk(42, 1, buf, recv.Callback());
  auto s = send.Wait(5s);
  auto r = recv.Wait(5s);
  ASSERT_TRUE(s && r);
  EXPECT_EQ(s->code(), StatusCode::kUnavailable);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable);
  engine->Disconnect(42);  // no-op
  Drain(*engine);
}

TEST_F(EngineTest, OversizedControlMessageClosesThePeer) {
  for (size_t size : {size_t{100000}, size_t{2} << 20}) {
    EngineOptions options;
    options.max_message_bytes = 65536;
    EventLog events;  // peer ids restart in each engine
    auto engine = Engine::Start(options, events.Handlers());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto helper = StartHelper();
    ASSERT_TRUE(helper);
    Result<PeerId> peer = (*engine)->Connect(helper->address);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    ASSERT_TRUE((*engine)->Send(*peer, AsBytes("cmd:big " + std::to_string(size) + " 3")).ok());
    auto reason = events.WaitClosed(*peer, 10s);
    ASSERT_TRUE(reason) << size;
    EXPECT_EQ(reason->code(), StatusCode::kInvalidArgument) << reason->ToString();
    EXPECT_NE(reason->message().find(std::to_string(size) + "-byte control message"), std::string::npos)
        << reason->ToString();
  }
}

TEST_F(EngineTest, DisconnectCancelsLocallyAndNotifiesTheRemoteEngine) {
  EventLog server_events;
  EngineOptions server_options;
  server_options.listen = "127.0.0.1:0";
  auto server = Engine::Start(server_options, server_events.Handlers());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = StartEngine();
  Result<PeerId> peer = client->Connect((*server)->listen_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto accepted = server_events.WaitAccepted(5s);
  ASSERT_TRUE(accepted);

  // Sent just before Disconnect: the graceful close lets them finish (flush) before closing.
  std::vector<std::byte> big(2u << 20);
  FillPattern(big, 21, 0);
  ASSERT_TRUE(client->Send(*peer, big).ok());
  ASSERT_TRUE(client->Send(*peer, AsBytes("last words")).ok());
  std::vector<std::byte> buf(1024);
  CompletionLatch recv;
  client->RecvBulk(*peer, 9, buf, recv.Callback());
  client->Disconnect(*peer);
  auto r = recv.Wait(5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kCancelled) << r->ToString();
  auto heard_big = server_events.NextMessage(5s);
  ASSERT_TRUE(heard_big);
  EXPECT_TRUE(heard_big->bytes == big);
  auto heard = server_events.NextMessage(5s);
  ASSERT_TRUE(heard);
  EXPECT_EQ(heard->text(), "last words");
  auto reason = server_events.WaitClosed(accepted->first, 10s);
  ASSERT_TRUE(reason) << "the remote engine did not notice the disconnect";
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->Send(*peer, AsBytes("x")).code(), StatusCode::kNotFound);
  EXPECT_EQ(events_.closed_count(), 0u) << "on_peer_closed must not fire for a local Disconnect";
}

TEST_F(EngineTest, DestructionWithPendingOperationsCompletesThem) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  std::vector<std::byte> in(1u << 20), out(8u << 20);
  CompletionLatch recv, send;
  engine->RecvBulk(*peer, 1, in, recv.Callback());
  engine->SendBulk(*peer, 2, out, send.Callback());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine->Send(*peer, AsBytes("bye")).ok());
  auto t0 = std::chrono::steady_clock::now();
  engine.reset();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("engine destroyed in %.3f s with pending operations\n", seconds);
  auto r = recv.Wait(0ms);
  auto s = send.Wait(0ms);
  ASSERT_TRUE(r && s) << "destructor returned with operations still pending";
  std::printf("pending receive: %s\npending send: %s\n", r->ToString().c_str(), s->ToString().c_str());
  EXPECT_EQ(r->code(), StatusCode::kCancelled) << r->ToString();
  EXPECT_FALSE(s->ok());
  EXPECT_EQ(recv.calls(), 1);
  EXPECT_EQ(send.calls(), 1);
  EXPECT_EQ(events_.closed_count(), 0u);
}

}  // namespace
}  // namespace viper::net::testing

namespace viper::net::testing {
namespace {

// A node restarted on its fixed port must be able to listen again at once, although the
// connections of its previous life linger in TIME_WAIT.
TEST_F(EngineTest, RestartedListenerRebindsItsPortAtOnce) {
  std::string address = "127.0.0.1:" + std::to_string(UnusedPort());
  for (int life = 0; life < 2; ++life) {
    EngineOptions options;
    options.listen = address;
    auto server = Engine::Start(options, {});
    ASSERT_TRUE(server.ok()) << "life " << life << ": " << server.status().ToString();
    auto client = StartEngine();
    Result<PeerId> peer = client->Connect(address);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    ASSERT_TRUE(client->SendAndWait(*peer, AsBytes("hi")).ok());
    server->reset();  // the server closes first: its side of the connections enters TIME_WAIT
  }
}

}  // namespace
}  // namespace viper::net::testing
