// The UCX engine when things go wrong: killed peers, refused or silent connections, bad
// addresses, protocol violations, disconnects, destruction with work pending, restarts.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "net/engine_fixture.h"

namespace viper::net::testing {
namespace {

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

// Receives already matched to a message in flight cannot be cancelled by tag: they must still
// end (with an error) when the sender dies mid-transfer.
TEST_F(EngineTest, PeerKilledMidTransferEndsEveryReceive) {
  auto engine = StartEngine();
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  constexpr size_t kChunk = 4u << 20, kChunks = 64;
  std::vector<std::byte> buffer(kChunk * kChunks);
  std::vector<CompletionLatch> latches(kChunks);
  for (size_t i = 0; i < kChunks; ++i) {
    engine->RecvBulk(*peer, 100 + i, std::span<std::byte>(buffer).subspan(i * kChunk, kChunk), latches[i].Callback());
  }
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:send-bulk 100 268435456 4194304 8 5 0")).ok());
  ASSERT_TRUE(latches[2].Wait(30s)) << "the transfer did not start";
  helper->process.Kill(SIGKILL);
  ASSERT_TRUE(events_.WaitClosed(*peer, 15s)) << "on_peer_closed did not fire";
  size_t ok = 0, failed = 0;
  for (auto& latch : latches) {
    auto st = latch.Wait(10s);
    ASSERT_TRUE(st) << "a receive never completed";
    if (st->ok()) {
      ++ok;
    } else {
      ++failed;
      EXPECT_EQ(st->code(), StatusCode::kUnavailable) << st->ToString();
    }
    EXPECT_EQ(latch.calls(), 1);
  }
  std::printf("killed mid-transfer: %zu chunks arrived, %zu failed\n", ok, failed);
  EXPECT_GT(failed, 0u);
}

// Receivers killed while this engine is in the middle of sending to them: the sends end with an
// error and this process lives on. UCX 1.13's TCP transport completed an interrupted zero-copy
// send twice when the socket's send failed before its receive noticed the death, and its assertion
// aborted the sender (in CI, a relay of a placed tree whose child was killed died with it; the
// engine now copies fragments instead, src/net/engine.cc). Six receivers per round, killed as
// their first chunk lands. With zero-copy sends back (UCX_ZCOPY_THRESH=auto) 6 of 8 runs of these
// 60 rounds aborted; without them, none of 1200 kills did.
TEST_F(EngineTest, SenderOutlivesReceiversKilledMidTransfer) {
  auto engine = StartEngine();
  constexpr size_t kChunks = 16, kReceivers = 6;
#if defined(__SANITIZE_THREAD__)
  // Fewer rounds and 1 MiB chunks, for the races: with 4 MiB chunks the first chunk to land took
  // 3-5 s under TSan (six 64 MiB streams share the instrumented progress thread), and 15 rounds
  // took 218 s of the TSan stage's 335 s (2026-11-29). Release runs all 60 with 4 MiB chunks.
  constexpr int kRounds = 15;
  constexpr size_t kChunk = 1u << 20;
#elif defined(__SANITIZE_ADDRESS__)
  // 172 s for 60 under ASan beside the rest of the suite (2026-11-29: the file ran past its 180 s
  // limit), 63 s in release alone: each round starts six helper processes. What ASan adds is
  // memory errors on the same paths, which 20 rounds walk; release runs all 60.
  constexpr int kRounds = 20;
  constexpr size_t kChunk = 4u << 20;
#else
  constexpr int kRounds = 60;
  constexpr size_t kChunk = 4u << 20;
#endif
  std::vector<std::byte> data(kChunk * kChunks);
  const std::string receive = "cmd:recv-bulk 100 " + std::to_string(data.size()) + " " + std::to_string(kChunk) + " 8 5";
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Helper> helpers;
    std::vector<PeerId> peers;
    std::vector<std::vector<CompletionLatch>> latches(kReceivers);
    for (size_t r = 0; r < kReceivers; ++r) {
      auto helper = StartHelper();
      ASSERT_TRUE(helper);
      helpers.push_back(std::move(*helper));
    }
    for (size_t r = 0; r < kReceivers; ++r) {
      Result<PeerId> peer = engine->Connect(helpers[r].address);
      ASSERT_TRUE(peer.ok()) << peer.status().ToString();
      peers.push_back(*peer);
      ASSERT_TRUE(engine->Send(*peer, AsBytes(receive)).ok());
      latches[r] = std::vector<CompletionLatch>(kChunks);
      for (size_t i = 0; i < kChunks; ++i)
        engine->SendBulk(*peer, 100 + i, std::span<std::byte>(data).subspan(i * kChunk, kChunk), latches[r][i].Callback());
    }
    for (size_t r = 0; r < kReceivers; ++r) {
      ASSERT_TRUE(latches[r][0].Wait(30s)) << "the transfer did not start";
      helpers[r].process.Kill(SIGKILL);
    }
    for (size_t r = 0; r < kReceivers; ++r) {
      ASSERT_TRUE(events_.WaitClosed(peers[r], 15s)) << "on_peer_closed did not fire";
      for (auto& latch : latches[r]) {
        auto st = latch.Wait(10s);
        ASSERT_TRUE(st) << "a send never completed";
        EXPECT_TRUE(st->ok() || st->code() == StatusCode::kUnavailable) << st->ToString();
        EXPECT_EQ(latch.calls(), 1);
      }
    }
  }
}

TEST_F(EngineTest, KilledAcceptedPeerIsReported) {
  auto a = StartEngineWithHelper();
  ASSERT_TRUE(a);
  std::vector<std::byte> in(4096);
  CompletionLatch recv;
  a->engine->RecvBulk(a->peer, 42, in, recv.Callback());
  a->child.Kill(SIGKILL);
  auto reason = events_.WaitClosed(a->peer, 15s);
  ASSERT_TRUE(reason);
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable) << reason->ToString();
  auto r = recv.Wait(5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable);
  EXPECT_EQ(a->engine->stats().peers, 0u);
}

// How long an idle helper may take to answer a ping in the liveness tests below. Its process is
// idle, but under a sanitizer beside the rest of the suite on 2 vCPUs its progress thread may
// wait its turn for longer than 500 ms; a frozen peer is still told apart, since it never answers.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr auto kIdlePeerAnswer = std::chrono::milliseconds(3000);
#else
constexpr auto kIdlePeerAnswer = std::chrono::milliseconds(500);
#endif

// Liveness (EngineOptions::peer_silence): a peer that stops answering (its host cut off without
// FIN or RST, or, here, its process frozen) is failed once it has been silent and left a ping
// unanswered; one that answers, idle or busy moving bulk data, is kept.
TEST_F(EngineTest, FrozenPeerIsDroppedAfterAnUnansweredPing) {
  EngineOptions options;
  options.peer_silence = 300ms;
  options.peer_answer = kIdlePeerAnswer;
  auto a = StartEngineWithHelper(options);
  ASSERT_TRUE(a);
  Engine* engine = a->engine.get();
  std::this_thread::sleep_for(2s);  // idle for about six pings, each answered
  EXPECT_EQ(engine->stats().peers, 1u);
  EXPECT_EQ(engine->stats().peers_silent, 0u);
  std::vector<std::byte> in(4096);
  CompletionLatch recv;
  engine->RecvBulk(a->peer, 42, in, recv.Callback());
  a->child.Kill(SIGSTOP);
  const auto frozen = std::chrono::steady_clock::now();
  auto reason = events_.WaitClosed(a->peer, 10s);
  const auto took = std::chrono::steady_clock::now() - frozen;
  a->child.Kill(SIGCONT);
  ASSERT_TRUE(reason) << "a frozen peer was kept for 10 s";
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable) << reason->ToString();
  const std::string unanswered = "did not answer a ping within " + std::to_string(kIdlePeerAnswer.count()) + " ms";
  EXPECT_NE(reason->message().find(unanswered), std::string::npos) << reason->ToString();
  EXPECT_LT(took, options.peer_silence + kIdlePeerAnswer + 4s);
  auto r = recv.Wait(5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable) << r->ToString();
  EXPECT_EQ(engine->stats().peers, 0u);
  EXPECT_EQ(engine->stats().peers_silent, 1u);
}

// A peer that answers pings but never posts the receive for bytes sent to it (a client that asks
// for a version and does not take it) is failed once none of the transfers with it completed for
// transfer_stall: otherwise the sends, and the segments they read, would be pinned for ever.
TEST_F(EngineTest, PeerThatTakesNoneOfItsBulkSendsIsDropped) {
  EngineOptions options;
  options.peer_silence = 300ms;
  options.peer_answer = kIdlePeerAnswer;
  options.transfer_stall = 1500ms;
  auto a = StartEngineWithHelper(options);
  ASSERT_TRUE(a);
  Engine* engine = a->engine.get();
  std::vector<std::byte> out(8u << 20);  // rendezvous: the send waits for the peer's receive
  CompletionLatch sent;
  const auto start = std::chrono::steady_clock::now();
  engine->SendBulk(a->peer, 4242, out, sent.Callback());
  auto reason = events_.WaitClosed(a->peer, 10s);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(reason) << "a peer that takes nothing was kept for 10 s";
  EXPECT_EQ(reason->code(), StatusCode::kUnavailable) << reason->ToString();
  EXPECT_NE(reason->message().find("completed none of the 1 bulk transfer(s) pending with it"), std::string::npos)
      << reason->ToString();
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 5s);
  // The send itself ends when UCX gives up on the force-closed endpoint (20 s measured), which
  // releases what its buffer pins; until the peer is dropped it would never end.
  auto r = sent.Wait(90s);
  std::printf("peer dropped after %.1f s, its send ended after %.1f s\n", std::chrono::duration<double>(took).count(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable) << r->ToString();
  EXPECT_EQ(engine->stats().peers_stalled, 1u);
  EXPECT_EQ(engine->stats().peers_silent, 0u);  // it answered every ping
}

// The other direction: bytes a peer announced (a client's PUBLISH, for which the node posted the
// receives into a segment) that never come. The receive is cancelled with the peer.
TEST_F(EngineTest, PeerThatSendsNoneOfWhatItAnnouncedIsDropped) {
  EngineOptions options;
  options.peer_silence = 300ms;
  options.peer_answer = kIdlePeerAnswer;
  options.transfer_stall = 1500ms;
  auto a = StartEngineWithHelper(options);
  ASSERT_TRUE(a);
  Engine* engine = a->engine.get();
  std::vector<std::byte> in(1u << 20);
  CompletionLatch received;
  const auto start = std::chrono::steady_clock::now();
  engine->RecvBulk(a->peer, 4343, in, received.Callback());
  auto reason = events_.WaitClosed(a->peer, 10s);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(reason) << "a peer that sends nothing was kept for 10 s";
  EXPECT_NE(reason->message().find("completed none of the 1 bulk transfer(s) pending with it"), std::string::npos)
      << reason->ToString();
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 5s);
  auto r = received.Wait(5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), StatusCode::kUnavailable) << r->ToString();
  EXPECT_EQ(engine->stats().peers_stalled, 1u);
  EXPECT_EQ(engine->stats().peers_silent, 0u);
}

// One 256 MiB message each way: while it moves nothing else comes from the peer, so the engine
// pings it (every 50 ms of silence); the ping waits behind the data and the peer still answers.
TEST_F(EngineTest, PeerBusyWithOneLongTransferIsNotTakenForSilent) {
  EngineOptions options;
  options.peer_silence = 50ms;
  // The answer must be allowed longer than one 256 MiB message takes: under ASan beside the rest of
  // the suite that passed 3 s (2026-11-29, the ping answered after the send was failed).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  options.peer_answer = 20s;
#else
  options.peer_answer = 3s;
#endif
  auto engine = StartEngine(options);
  auto helper = StartHelper();
  ASSERT_TRUE(helper);
  Result<PeerId> peer = engine->Connect(helper->address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  // One message each way that lasts far longer than peer_silence: 256 MiB, 64 MiB under TSan (256
  // took 12 s each way there, the test 25 s; 64 MiB still lasts seconds, 60x the silence allowed).
#if defined(__SANITIZE_THREAD__)
  constexpr size_t kTotal = 64u << 20;
#else
  constexpr size_t kTotal = 256u << 20;
#endif
  const std::string total = std::to_string(kTotal);
  std::vector<std::byte> buffer(kTotal);
  CompletionLatch received;
  engine->RecvBulk(*peer, 700, buffer, received.Callback());
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:send-bulk 700 " + total + " " + total + " 1 31 0")).ok());
  auto in = received.Wait(60s);
  ASSERT_TRUE(in);
  ASSERT_TRUE(in->ok()) << in->ToString();
  EXPECT_EQ(NextText(), "done:send-bulk ok");
  EXPECT_EQ(FindPatternMismatch(buffer, 31, 0), -1);

  FillPattern(buffer, 32, 0);
  ASSERT_TRUE(engine->Send(*peer, AsBytes("cmd:recv-bulk 800 " + total + " " + total + " 1 32")).ok());
  CompletionLatch sent;
  engine->SendBulk(*peer, 800, buffer, sent.Callback());
  auto out = sent.Wait(60s);
  ASSERT_TRUE(out);
  EXPECT_TRUE(out->ok()) << out->ToString();
  EXPECT_EQ(NextText(), "done:recv-bulk ok");
  EXPECT_EQ(engine->stats().peers_silent, 0u);
  EXPECT_EQ(engine->stats().peers, 1u);
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

// A TCP socket listening on a free loopback port (none on failure, recorded); *address its "HOST:PORT".
int ListenOnLoopback(std::string* address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "a loopback listener: " << std::strerror(errno);
    if (fd >= 0) close(fd);
    return -1;
  }
  *address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  return fd;
}

TEST_F(EngineTest, ConnectToSilentListenerTimesOut) {
  // A TCP socket that listens but never speaks UCX: the handshake cannot finish.
  std::string address;
  int fd = ListenOnLoopback(&address);
  ASSERT_GE(fd, 0);
  EngineOptions options;
  options.connect_timeout = 1s;
  auto engine = StartEngine(options);
  auto t0 = std::chrono::steady_clock::now();
  Result<PeerId> peer = engine->Connect(address);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  ASSERT_FALSE(peer.ok());
  std::printf("silent listener: failed after %.3f s: %s\n", seconds, peer.status().ToString().c_str());
  EXPECT_NE(peer.status().message().find(address), std::string::npos) << peer.status().ToString();
  EXPECT_LT(seconds, 1.0 + 1.0);
}

TEST_F(EngineTest, ConnectToAnotherServiceSaysNoNodeAnswers) {
  // Another service on the port (it greets first, as SSH does): its bytes do not parse as a
  // bootstrap frame. That is Unavailable naming the address, not InvalidArgument (which the CLI
  // reports as a usage error, exit 2).
  std::string address;
  int fd = ListenOnLoopback(&address);
  ASSERT_GE(fd, 0);
  std::thread greeter([fd] {
    int c = accept(fd, nullptr, nullptr);
    if (c < 0) return;
    const char banner[] = "SSH-2.0-OpenSSH_9.2\r\n";
    (void)!write(c, banner, sizeof(banner) - 1);
    char sink[256];
    while (read(c, sink, sizeof(sink)) > 0) {}
    close(c);
  });
  auto engine = StartEngine();
  Result<PeerId> peer = engine->Connect(address);
  shutdown(fd, SHUT_RDWR);
  close(fd);
  greeter.join();
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), StatusCode::kUnavailable) << peer.status().ToString();
  EXPECT_NE(peer.status().message().find("no Viper node of this protocol answers at " + address), std::string::npos)
      << peer.status().ToString();
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

// A node restarted on its fixed port must be able to listen again at once, although the
// connections of its previous life linger in TIME_WAIT.
TEST_F(EngineTest, RestartedListenerRebindsItsPortAtOnce) {
  std::string address = "127.0.0.1:0";  // the first life takes a free port, the second reuses it
  for (int life = 0; life < 2; ++life) {
    EngineOptions options;
    options.listen = address;
    auto server = Engine::Start(options, {});
    ASSERT_TRUE(server.ok()) << "life " << life << ": " << server.status().ToString();
    address = (*server)->listen_address();
    auto client = StartEngine();
    Result<PeerId> peer = client->Connect(address);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    ASSERT_TRUE(client->SendAndWait(*peer, AsBytes("hi")).ok());
    server->reset();  // the server closes first: its side of the connections enters TIME_WAIT
  }
}

// How the engine answered a raw TCP client that sent `bytes` to its listener: "closed" or
// "reset" (what it must do), "answered" or "idle" (still open after `wait`).
std::string RawClient(uint16_t port, const std::string& bytes, std::chrono::milliseconds wait) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  if (!bytes.empty()) (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  timeval tv{};
  tv.tv_sec = wait.count() / 1000;
  tv.tv_usec = (wait.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  int err = errno;
  close(fd);
  if (n == 0) return "closed";
  if (n > 0) return "answered";
  return err == ECONNRESET ? "reset" : "idle";
}

uint16_t PortOf(const std::string& host_port) { return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1))); }

// The listener is the engine's own socket (src/net/bootstrap.h): nothing a raw client sends
// reaches UCX before a well-formed bootstrap frame. UCX 1.13's own listener aborted the whole
// process on the first payload below and left the second open forever.
TEST_F(EngineTest, GarbageOnTheListenerIsDroppedAndTheEngineKeepsServing) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  auto server = StartEngine(options);
  const uint16_t port = PortOf(server->listen_address());
  std::string ascending;
  for (int i = 0; i < 256 * 64; ++i) ascending.push_back(static_cast<char>(i & 0xff));
  // "VIPB" | u16 version | u8 type | u8 flags | u32 body length | body (src/net/bootstrap.h).
  auto frame = [](uint16_t version, uint8_t type, uint32_t length, const std::string& body) {
    std::string f = "VIPB";
    f += static_cast<char>(version & 0xff), f += static_cast<char>(version >> 8);
    f += static_cast<char>(type), f += '\0';
    for (int i = 0; i < 4; ++i) f += static_cast<char>((length >> (8 * i)) & 0xff);
    return f + body;
  };
  const std::vector<std::pair<std::string, std::string>> garbage = {
      {"UCX connection-manager header with trailing bytes", std::string("\x10", 1) + std::string(7, '\0') + std::string(100, 'x')},
      {"bytes 0..255 repeated", ascending},
      {"an HTTP request", "GET / HTTP/1.0\r\n\r\n"},
      {"a PROOF before the HELLO", frame(3, 3, 8, "12345678")},
      {"a HELLO with a short nonce", frame(3, 1, 8, "12345678")},
  };
  for (const auto& [what, bytes] : garbage) {
    std::string answer = RawClient(port, bytes, 3s);
    EXPECT_TRUE(answer == "closed" || answer == "reset") << what << ": " << answer;
  }
  // Frames with Viper's magic that the listener cannot take: it says so (a short RESULT, which an
  // older or newer peer can print), then closes.
  const std::vector<std::pair<std::string, std::string>> told = {
      {"a frame of another version", frame(9, 1, 8, "12345678")},
      {"a version-1 frame (the token in clear)", frame(1, 0, 8, "12345678")},
      {"a frame claiming 2 GiB", frame(3, 3, 0x7fffffffu, "xx")},
  };
  for (const auto& [what, bytes] : told) {
    std::string answer = RawClient(port, bytes, 3s);
    EXPECT_TRUE(answer == "answered" || answer == "closed" || answer == "reset") << what << ": " << answer;
  }
  // A client that connects and says nothing is dropped after the first-frame deadline (2 s).
  auto t0 = std::chrono::steady_clock::now();
  std::string silent = RawClient(port, "", 10s);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(silent == "closed" || silent == "reset") << "silent client: " << silent;
  EXPECT_LT(waited, 4.5);
  std::printf("silent client dropped after %.1f s\n", waited);
  EXPECT_GE(server->stats().handshakes_refused, garbage.size() + told.size() + 1);
  EXPECT_GE(server->stats().handshakes_timed_out, 1u);
  // The engine still accepts a real peer, and nothing above became one.
  EXPECT_EQ(server->stats().peers, 0u);
  auto client = StartEngine();
  Result<PeerId> peer = client->Connect(server->listen_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto accepted = events_.WaitAccepted(5s);
  ASSERT_TRUE(accepted);
  ASSERT_TRUE(client->Send(*peer, AsBytes("still serving")).ok());
  auto m = events_.NextMessage(5s);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->text(), "still serving");
}

// A listener with a token checks it in the bootstrap handshake, before UCX sees the peer's worker
// address: UCX 1.13 aborts the process on a malformed one (ucp_address_unpack), so without the
// token nobody gets that far. Each side proves the token without sending it; both directions
// refuse a mismatch with PermissionDenied naming the peer.
TEST_F(EngineTest, ListenerWithTokenDropsPeersWithoutItBeforeUcxSeesThem) {
  EngineOptions options;
  options.listen = "127.0.0.1:0";
  options.token = "s3cret";
  auto server = StartEngine(options);
  const std::string listen = server->listen_address();
  // A client with another token: the node's proof does not match, the client refuses it (and
  // tells the node, which counts it).
  EngineOptions wrong;
  wrong.token = "guess";
  auto intruder = Engine::Start(wrong, {});
  ASSERT_TRUE(intruder.ok());
  Result<PeerId> refused = (*intruder)->Connect(listen);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("wrong token"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(listen), std::string::npos) << refused.status().ToString();
  // A client without a token is told by the node.
  auto anonymous = Engine::Start({}, {});
  ASSERT_TRUE(anonymous.ok());
  Result<PeerId> told = (*anonymous)->Connect(listen);
  ASSERT_FALSE(told.ok());
  EXPECT_EQ(told.status().code(), StatusCode::kPermissionDenied) << told.status().ToString();
  EXPECT_NE(told.status().message().find("refused by " + listen + ": a token is required"), std::string::npos)
      << told.status().ToString();
  // A client with a token refuses a node without one: it cannot prove it belongs to the fleet.
  EngineOptions open_options;
  open_options.listen = "127.0.0.1:0";
  auto open_node = StartEngine(open_options);
  EngineOptions careful;
  careful.token = "s3cret";
  auto careful_client = Engine::Start(careful, {});
  ASSERT_TRUE(careful_client.ok());
  Result<PeerId> unproven = (*careful_client)->Connect(open_node->listen_address());
  ASSERT_FALSE(unproven.ok());
  EXPECT_EQ(unproven.status().code(), StatusCode::kPermissionDenied) << unproven.status().ToString();
  EXPECT_NE(unproven.status().message().find("holds no token"), std::string::npos) << unproven.status().ToString();
  EXPECT_EQ(server->stats().peers, 0u);
  EXPECT_GE(server->stats().handshakes_refused_token, 2u);
  EngineOptions right;
  right.token = "s3cret";
  auto client = StartEngine(right);
  Result<PeerId> peer = client->Connect(listen);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(client->Send(*peer, AsBytes("with the token")).ok());
  auto m = events_.NextMessage(5s);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->text(), "with the token");
}

}  // namespace
}  // namespace viper::net::testing
