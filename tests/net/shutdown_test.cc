// The engine's ownership of operations across completion, peer failure and shutdown: a receive
// that UCX completes inside the call that posts it (its message arrived first), and Stop() while
// operations are in flight in every state, many rounds, with real peer processes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "net/engine_fixture.h"

namespace viper::net::testing {
namespace {

std::string SendBulkCommand(uint64_t tag0, size_t total, size_t chunk, int inflight, uint64_t seed) {
  return "cmd:send-bulk " + std::to_string(tag0) + " " + std::to_string(total) + " " + std::to_string(chunk) + " " +
         std::to_string(inflight) + " " + std::to_string(seed) + " 0";
}

// The helper sends first; the receive is posted once the message (eager) or its rendezvous request
// has arrived and waits unexpected. UCX 1.13 then completes some receives inside ucp_tag_recv_nbx
// (a multi-fragment eager message, a rendezvous larger than the buffer): each must complete once,
// with the right status, and leave no request behind (the engine must not list an op whose
// callback already ran, which its shutdown would then touch after it was freed).
TEST_F(EngineTest, ReceivePostedAfterItsMessageArrivedCompletesOnceAndLeavesNothingPending) {
  EngineOptions options;
  options.close_timeout = 5s;  // a close that waits on an operation stands out
  auto engine = StartEngine(options);
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  struct Case {
    size_t message, buffer;
    StatusCode expected;
  };
  const Case cases[] = {
      {4u << 10, 4u << 10, StatusCode::kOk},          {64u << 10, 64u << 10, StatusCode::kOk},
      {200u << 10, 200u << 10, StatusCode::kOk},      {600u << 10, 600u << 10, StatusCode::kOk},
      {2u << 20, 2u << 20, StatusCode::kOk},          {8u << 20, 8u << 20, StatusCode::kOk},
      {2u << 20, 512u << 10, StatusCode::kInvalidArgument},  // rendezvous into a smaller buffer
      {600u << 10, 64u << 10, StatusCode::kInvalidArgument},
      {4u << 10, 64u << 10, StatusCode::kCorruption},         // shorter than the buffer
      {200u << 10, 1u << 20, StatusCode::kCorruption},
  };
  uint64_t tag = 9000;
  for (const Case& c : cases) {
    ++tag;
    SCOPED_TRACE("message " + std::to_string(c.message) + " bytes into a " + std::to_string(c.buffer) + "-byte buffer");
    ASSERT_TRUE(engine->Send(*peer, AsBytes(SendBulkCommand(tag, c.message, c.message, 1, tag))).ok());
    // An eager send completes at the helper, which says so after the data (same connection); a
    // rendezvous send waits for our receive: its request has arrived well within 300 ms.
    std::optional<EventLog::Message> sent = events_.NextMessage(300ms);
    std::vector<std::byte> buffer(c.buffer);
    CompletionLatch latch;
    engine->RecvBulk(*peer, tag, buffer, latch.Callback());
    auto st = latch.Wait(10s);
    ASSERT_TRUE(st) << "the receive never completed";
    EXPECT_EQ(st->code(), c.expected) << st->ToString();
    if (c.expected == StatusCode::kOk) {
      EXPECT_EQ(FindPatternMismatch(buffer, tag, 0), -1);
    }
    if (!sent) sent = events_.NextMessage(10s);
    ASSERT_TRUE(sent) << "the helper never reported its send";
    EXPECT_EQ(sent->text().rfind("done:send-bulk", 0), 0u) << sent->text();
    Drain(*engine);
    EXPECT_EQ(latch.calls(), 1);
    EXPECT_EQ(engine->stats().requests_pending, 0u) << "a completed receive is still counted as pending";
  }
  // Nothing pending: the close does not wait for an operation until close_timeout (5 s). An op
  // still listed with its peer after it completed would hold it there, and be touched, freed.
  auto t0 = std::chrono::steady_clock::now();
  engine.reset();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("engine destroyed in %.3f s after %zu unexpected-first receives\n", seconds, std::size(cases));
  EXPECT_LT(seconds, 2.0) << "the close waited for an operation that had completed";
}

// Stop() while operations are in flight in every state: control messages queued and being sent,
// rendezvous sends the peer never receives, receives never sent to, receives matched before and
// after their data arrived and receives in mid-transfer, a peer connecting to the listener, a
// Connect() in progress on another thread, and a peer SIGKILLed at the same moment. Each round:
// every completion runs exactly once, Stop() returns without reaching its hard deadline, and no UCX
// request is left pending.
TEST_F(EngineTest, StopWithOperationsInEveryStateCompletesEachOnceManyRounds) {
  int rounds = 12;
  if (const char* r = std::getenv("VIPER_SHUTDOWN_ROUNDS")) rounds = std::max(1, std::atoi(r));
  auto sink = StartHelper();    // bulk sent to it is never received
  auto source = StartHelper();  // sends us bulk data
  ASSERT_TRUE(sink && source);
  std::mt19937 rng(20261127);
  constexpr auto kCloseTimeout = 300ms;
  double slowest = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    EngineOptions options;
    options.listen = "127.0.0.1:0";
    options.close_timeout = kCloseTimeout;
    options.connect_timeout = 3s;
    auto engine = StartEngine(options);
    ASSERT_TRUE(engine);
    auto victim = StartHelper();
    ASSERT_TRUE(victim);
    Result<PeerId> to_sink = engine->Connect(sink->address);
    Result<PeerId> to_source = engine->Connect(source->address);
    Result<PeerId> to_victim = engine->Connect(victim->address);
    ASSERT_TRUE(to_sink.ok() && to_source.ok() && to_victim.ok());

    const uint64_t base = 100000 * static_cast<uint64_t>(round + 1);
    std::deque<CompletionLatch> latches;
    auto latch = [&] { return latches.emplace_back().Callback(); };
    std::vector<std::byte> out(8u << 20), small_out(64u << 10);
    FillPattern(out, base, 0);
    // Sends the peers never receive (rendezvous, pending) and small ones that go out eagerly.
    for (PeerId p : {*to_sink, *to_victim}) {
      engine->SendBulk(p, base + 1, out, latch());
      engine->SendBulk(p, base + 2, small_out, latch());
      engine->RecvBulk(p, base + 3, std::span<std::byte>(small_out), latch());  // never sent: cancelled
    }
    // The source and the victim send chunks: some receives are posted before the data, some after
    // it arrived (matched unexpected), some never (the sender's rendezvous stays pending).
    constexpr size_t kChunk = 256u << 10, kChunks = 48;
    std::vector<std::byte> in(kChunk * kChunks), victim_in(kChunk * kChunks);
    auto post = [&](PeerId p, std::vector<std::byte>& into, uint64_t tag0, size_t i) {
      engine->RecvBulk(p, tag0 + i, std::span<std::byte>(into).subspan(i * kChunk, kChunk), latch());
    };
    for (size_t i = 0; i < kChunks; i += 3) post(*to_source, in, base + 1000, i);
    for (size_t i = 0; i < kChunks; i += 2) post(*to_victim, victim_in, base + 2000, i);
    ASSERT_TRUE(engine->Send(*to_source, AsBytes(SendBulkCommand(base + 1000, in.size(), kChunk, kChunks, 1))).ok());
    ASSERT_TRUE(engine->Send(*to_victim, AsBytes(SendBulkCommand(base + 2000, in.size(), kChunk, kChunks, 2))).ok());
    // Control messages, some large, queued on every peer.
    std::string text(100u << 10, 'x');
    for (int i = 0; i < 20; ++i) {
      for (PeerId p : {*to_sink, *to_source, *to_victim}) (void)engine->Send(p, AsBytes(i % 4 == 0 ? text : "ping"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 20)(rng)));
    for (size_t i = 1; i < kChunks; i += 3) post(*to_source, in, base + 1000, i);
    // A peer connecting to the listener and a Connect() in flight as the engine stops.
    auto dialer = ChildProcess::Start({HelperPath(), "--connect", engine->listen_address()});
    ASSERT_TRUE(dialer);
    std::optional<Result<PeerId>> connected;
    std::thread connector([&] { connected = engine->Connect(sink->address); });
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 30)(rng)));
    victim->process.Kill(SIGKILL);

    auto t0 = std::chrono::steady_clock::now();
    engine->Stop();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    connector.join();
    slowest = std::max(slowest, seconds);
    // close_timeout for the sends that never finish, then forced; the hard deadline, after which
    // Stop() gives up on requests that never completed, is 2 s later.
    EXPECT_LT(seconds, std::chrono::duration<double>(kCloseTimeout).count() + 1.9) << "Stop() reached its hard deadline";
    EXPECT_EQ(engine->stats().requests_pending, 0u) << "Stop() returned with UCX requests pending";
    ASSERT_TRUE(connected.has_value());
    size_t ok = 0, failed = 0;
    for (CompletionLatch& l : latches) {
      auto st = l.Wait(0ms);
      ASSERT_TRUE(st) << "an operation never completed";
      EXPECT_EQ(l.calls(), 1);
      (st->ok() ? ok : failed)++;
    }
    if (round == 0 || round + 1 == rounds) {
      std::printf("round %d: stop took %.3f s; %zu operations ok, %zu failed; concurrent connect: %s\n", round, seconds,
                  ok, failed, connected->ok() ? "connected" : connected->status().ToString().c_str());
    }
    engine.reset();
    dialer->Kill(SIGKILL);
    dialer->Wait(5s);
  }
  std::printf("%d rounds; slowest stop %.3f s\n", rounds, slowest);
}

// A helper SIGKILLed while UCX creates its worker leaves its shared-memory file behind; the
// harness gives each child its own UCX_POSIX_DIR and removes it once the child is reaped.
TEST_F(EngineTest, HelperKilledDuringStartLeavesNoUcxFileBehind) {
  int removed = 0;
  for (int i = 0; i < 20; ++i) {
    auto child = ChildProcess::Start({HelperPath(), "--listen", "127.0.0.1:0"});
    ASSERT_TRUE(child);
    const std::string dir = child->ucx_dir();
    ASSERT_EQ(dir.rfind("/dev/shm/", 0), 0u) << "no private UCX_POSIX_DIR: " << dir;
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * i));  // through UCX's start-up
    child->Kill(SIGKILL);
    ASSERT_NE(child->Wait(10s), -1);
    EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir << " is still there";
    removed += child->ucx_files_removed();
  }
  std::printf("20 helpers killed 0-95 ms after their start: %d UCX shared-memory files left behind, removed\n", removed);
}

}  // namespace
}  // namespace viper::net::testing
