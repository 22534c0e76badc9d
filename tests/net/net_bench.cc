// viper_net_bench: engine bandwidth and latency against a viper_net_test_peer process.
//   viper_net_bench [--bytes N] [--chunk N] [--inflight N]
// Runs over whatever transports UCX picks (same host: shared memory + CMA); run it with
// UCX_TLS=tcp to measure the TCP path. Prints the memcpy baseline of the same run and the ratio.
#include <cstdio>
#include <cstring>
#include <mutex>
#include <condition_variable>
#include <string>
#include <thread>
#include <algorithm>

#include "net/net_test_util.h"

namespace viper::net::testing {
namespace {

using namespace std::chrono_literals;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double MemcpyGBps(size_t total, size_t chunk, int inflight) {
  std::vector<std::byte> src(chunk * static_cast<size_t>(inflight)), dst(src.size());
  FillPattern(src, 1, 0);
  std::memcpy(dst.data(), src.data(), src.size());  // warm both
  auto t0 = std::chrono::steady_clock::now();
  for (size_t done = 0, i = 0; done < total; done += chunk, ++i) {
    size_t slot = (i % static_cast<size_t>(inflight)) * chunk;
    std::memcpy(dst.data() + slot, src.data() + slot, chunk);
  }
  return static_cast<double>(total) / Seconds(t0) / 1e9;
}

// Receives `total` bytes into a reused ring of `inflight` chunks.
bool ReceiveRing(Engine& engine, PeerId peer, uint64_t tag0, size_t total, size_t chunk, int inflight,
                 std::vector<std::byte>& ring) {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0, chunks = total / chunk;
  bool ok = true;
  for (size_t i = 0; i < chunks; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return i - done < static_cast<size_t>(inflight); });
    }
    std::span<std::byte> slot(ring.data() + (i % static_cast<size_t>(inflight)) * chunk, chunk);
    engine.RecvBulk(peer, tag0 + i, slot, [&](const Status& st) {
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok()) {
        ok = false;
        std::fprintf(stderr, "receive failed: %s\n", st.ToString().c_str());
      }
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == chunks; });
  return ok;
}

int Main(int argc, char** argv) {
  size_t total = 600u << 20, chunk = 4u << 20;
  int inflight = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--bytes") total = std::stoull(argv[i + 1]);
    else if (flag == "--chunk") chunk = std::stoull(argv[i + 1]);
    else if (flag == "--inflight") inflight = std::stoi(argv[i + 1]);
  }
  total = total / chunk * chunk;
  const char* tls = std::getenv("UCX_TLS");
  std::printf("viper_net_bench: %zu MiB in %zu KiB tagged chunks, %d in flight, UCX_TLS=%s\n", total >> 20,
              chunk >> 10, inflight, tls ? tls : "(default)");
  EventLog events;
  auto engine = Engine::Start({}, events.Handlers());
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().ToString().c_str()), 1;
  auto child = ChildProcess::Start({HelperPath(), "--listen", "127.0.0.1:0"});
  auto address = child ? child->WaitFor("LISTEN ", 10s) : std::nullopt;
  if (!address) return std::fprintf(stderr, "helper did not start\n"), 1;
  auto peer = (*engine)->Connect(*address);
  if (!peer.ok()) return std::fprintf(stderr, "%s\n", peer.status().ToString().c_str()), 1;

  double baseline = MemcpyGBps(total, chunk, inflight);
  std::vector<std::byte> ring(chunk * static_cast<size_t>(inflight));
  FillPattern(ring, 2, 0);
  for (int round = 0; round < 2; ++round) {  // round 0 warms up (page faults, UCX caches)
    std::string cmd = "cmd:send-bulk " + std::to_string(100000 * (round + 1)) + " " + std::to_string(total) + " " +
                      std::to_string(chunk) + " " + std::to_string(inflight) + " 9 1";
    auto t0 = std::chrono::steady_clock::now();
    if (!(*engine)->Send(*peer, AsBytes(cmd)).ok()) return 1;
    if (!ReceiveRing(**engine, *peer, 100000 * (round + 1), total, chunk, inflight, ring)) return 1;
    double gbps = static_cast<double>(total) / Seconds(t0) / 1e9;
    auto reply = events.NextMessage(30s);
    if (!reply || reply->text() != "done:send-bulk ok") return std::fprintf(stderr, "helper send failed\n"), 1;
    if (round == 1) {
      std::printf("receive  %.2f GB/s   memcpy baseline %.2f GB/s   ratio %.2f\n", gbps, baseline, gbps / baseline);
    }
  }
  for (int round = 0; round < 2; ++round) {
    uint64_t tag0 = 500000 + 100000 * static_cast<uint64_t>(round);
    std::string cmd = "cmd:recv-bulk " + std::to_string(tag0) + " " + std::to_string(total) + " " +
                      std::to_string(chunk) + " " + std::to_string(inflight) + " 9 1";
    auto t0 = std::chrono::steady_clock::now();
    if (!(*engine)->Send(*peer, AsBytes(cmd)).ok()) return 1;
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0, chunks = total / chunk;
    for (size_t i = 0; i < chunks; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return i - done < static_cast<size_t>(inflight); });
      }
      std::span<const std::byte> slot(ring.data() + (i % static_cast<size_t>(inflight)) * chunk, chunk);
      (*engine)->SendBulk(*peer, tag0 + i, slot, [&](const Status&) {
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        cv.notify_all();
      });
    }
    auto reply = events.NextMessage(60s);  // the receiver's "done" marks the end
    double gbps = static_cast<double>(total) / Seconds(t0) / 1e9;
    if (!reply || reply->text() != "done:recv-bulk ok") return std::fprintf(stderr, "helper receive failed\n"), 1;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == chunks; });
    if (round == 1) {
      std::printf("send     %.2f GB/s   memcpy baseline %.2f GB/s   ratio %.2f\n", gbps, baseline, gbps / baseline);
    }
  }
  std::vector<double> micros;
  std::vector<std::byte> ping(64);
  for (int i = 0; i < 2000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!(*engine)->Send(*peer, ping).ok() || !events.NextMessage(10s)) return 1;
    micros.push_back(Seconds(t0) * 1e6);
  }
  std::sort(micros.begin(), micros.end());
  std::printf("control ping-pong 64 B: p50 %.1f us  p99 %.1f us\n", micros[micros.size() / 2],
              micros[micros.size() * 99 / 100]);
  return 0;
}

}  // namespace
}  // namespace viper::net::testing

int main(int argc, char** argv) { return viper::net::testing::Main(argc, argv); }
