// The UCX engine against real processes (viper_net_test_peer) and real UCX over loopback:
// messages, bulk data, idle behaviour, API misuse.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "net/engine_fixture.h"

namespace viper::net::testing {
namespace {

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

  // A send is counted when UCX completes it, which may be after the helper's reply has arrived.
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       engine->stats().messages_out < 3 && std::chrono::steady_clock::now() < deadline;)
    std::this_thread::sleep_for(10ms);
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

TEST_F(EngineTest, IdleCpuIsNearZeroWithAConnectedPeer) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(engine->Send(*peer, AsBytes("warm up")).ok());
  EXPECT_EQ(NextText(), "warm up");
  // Past the spin phase and start-up: settled once a 200 ms window used under 5% of a CPU on
  // either side (10 s at most, for a sanitizer build on a loaded machine). A spinning progress
  // thread never settles.
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    const double self_start = ProcessCpuSeconds(), helper_start = helper->process.CpuSeconds();
    std::this_thread::sleep_for(200ms);
    if (ProcessCpuSeconds() - self_start < 0.01 && helper->process.CpuSeconds() - helper_start < 0.01) break;
  }
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

// An engine cannot be its own peer (both endpoints would live in one worker, and UCX pairs an
// endpoint to one's own address with itself): connecting to its own listener fails clearly and
// leaves no accepted peer behind.
TEST_F(EngineTest, ConnectingToItsOwnListenerIsRefused) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto engine = StartEngine(options);
  Result<PeerId> client_side = engine->Connect(engine->listen_address());
  ASSERT_FALSE(client_side.ok());
  EXPECT_EQ(client_side.status().code(), StatusCode::kUnavailable) << client_side.status().ToString();
  EXPECT_NE(client_side.status().message().find("own listener"), std::string::npos) << client_side.status().ToString();
  EXPECT_FALSE(events_.WaitAccepted(200ms));
  EXPECT_EQ(engine->stats().peers, 0u);
}

}  // namespace
}  // namespace viper::net::testing
